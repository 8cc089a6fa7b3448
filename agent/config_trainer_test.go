package agent

import (
	"os/user"
	"strconv"
	"strings"
	"testing"
)

// trainer.user takes a name or a uid (a name resolved at load); trainer.container a container
// ID, prefix or name, and is a way to find the trainer of its own.
func TestConfigTrainerUserAndContainer(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		env     []string
		uid     string // "" means nil (any user)
		ctr     string
		wantErr string // a part of Validate's error; "" means valid
	}{
		{[]string{"SPOTGUARD_TRAINER_MATCH=train"}, "", "", ""},
		{[]string{"SPOTGUARD_TRAINER_MATCH=train", "SPOTGUARD_TRAINER_USER=" + me.Username}, me.Uid, "", ""},
		{[]string{"SPOTGUARD_TRAINER_MATCH=train", "SPOTGUARD_TRAINER_USER=4242"}, "4242", "", ""},
		{[]string{"SPOTGUARD_TRAINER_MATCH=train", "SPOTGUARD_TRAINER_USER=no-such-user-spotguard"}, "", "",
			`trainer.user: "no-such-user-spotguard" from SPOTGUARD_TRAINER_USER: no user "no-such-user-spotguard" here`},
		{[]string{"SPOTGUARD_TRAINER_CONTAINER=3f4a9c2b7d1e"}, "", "3f4a9c2b7d1e", ""},
		{[]string{"SPOTGUARD_TRAINER_CONTAINER=trainer"}, "", "trainer", ""},
		{[]string{"SPOTGUARD_TRAINER_CONTAINER=my trainer"}, "", "my trainer", `trainer.container: "my trainer" from SPOTGUARD_TRAINER_CONTAINER: want a container ID`},
		{[]string{"SPOTGUARD_TRAINER_USER=root"}, "0", "", "no way to find the trainer: set trainer.pidfile, trainer.unit, trainer.match or trainer.container"},
	}
	for _, tt := range tests {
		c := mustLoad(t, LoadOptions{Environ: tt.env})
		err := c.Validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("Validate(%v) = %v; want nil", tt.env, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("Validate(%v) = %v; want an error containing %q", tt.env, err, tt.wantErr)
		case strings.HasPrefix(tt.wantErr, "trainer.") && strings.Contains(err.Error(), "no way to find"):
			t.Errorf("Validate(%v) = %v; want no \"no way to find\" on top of the bad value", tt.env, err)
		}
		got := ""
		if c.Trainer.User != nil {
			got = strconv.Itoa(*c.Trainer.User)
		}
		if got != tt.uid || c.Trainer.Container != tt.ctr {
			t.Errorf("Load(%v): user %q container %q; want %q, %q", tt.env, got, c.Trainer.Container, tt.uid, tt.ctr)
		}
	}
}
