package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// The README's CLI section lists every command in one line each, with the line `spotguard -h`
// gives it, in the same order.
func TestREADMEListsEveryCommand(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## CLI\n\n```\n")
	block, _, ok2 := strings.Cut(section, "```\n")
	if !ok || !ok2 {
		t.Fatal("README has no ## CLI section opening with a code block")
	}
	var want []string
	for _, c := range commands() {
		want = append(want, fmt.Sprintf("spotguard %-10s%s", c.name, c.summary))
	}
	if got := strings.Split(strings.TrimSuffix(block, "\n"), "\n"); !slices.Equal(got, want) {
		t.Errorf("README CLI block:\n%s\nwant, one line per command as `spotguard -h` has it:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
