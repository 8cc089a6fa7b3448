package cuda

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The package has exactly one package doc comment.
func TestPackageDoc(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc != nil {
			docs = append(docs, f)
		}
	}
	if len(docs) != 1 {
		t.Errorf("Got(package doc comments) = %v; want exactly one file with one", docs)
	}
}

// cuDeviceGetUuid's bytes are written as NVML writes a GPU's UUID, so the two can be matched.
func TestFormatUUID(t *testing.T) {
	for _, tt := range []struct {
		b    [16]byte
		want string
	}{
		{[16]byte{}, "GPU-00000000-0000-0000-0000-000000000000"},
		{[16]byte{0xf0, 0x0d, 0xca, 0xfe, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67},
			"GPU-f00dcafe-1234-5678-9abc-def001234567"},
		{[16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
			"GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"},
	} {
		if got := FormatUUID(tt.b); got != tt.want {
			t.Errorf("Got(%x) = %v; want %v", tt.b[:], got, tt.want)
		}
	}
}

func TestFormatVersion(t *testing.T) {
	for v, want := range map[int]string{12040: "12.4", 13000: "13.0", 11080: "11.8", 12090: "12.9"} {
		if got := FormatVersion(v); got != want {
			t.Errorf("Got(%d) = %v; want %v", v, got, want)
		}
	}
}

// Every architecture from Volta on has a copy efficiency, marked as an assumption until it is
// measured; one the table does not know is said so, never guessed.
func TestArchOf(t *testing.T) {
	for _, tt := range []struct {
		cc   string
		maj  int
		min  int
		want string // "" when unknown
	}{
		{"7.0", 7, 0, "Volta"},
		{"7.5", 7, 5, "Turing"},
		{"8.0", 8, 0, "Ampere"},
		{"8.6", 8, 6, "Ampere"},
		{"8.7", 8, 7, "Ampere"},
		{"8.9", 8, 9, "Ada"},
		{"9.0", 9, 0, "Hopper"},
		{"10.0", 10, 0, "Blackwell"},
		{"10.3", 10, 3, "Blackwell"},
		{"12.0", 12, 0, "Blackwell"},
		{"6.0", 6, 0, ""},
		{"8.1", 8, 1, ""},
		{"11.0", 11, 0, ""},
	} {
		a, ok := ArchOf(tt.maj, tt.min)
		if ok != (tt.want != "") || a.Name != tt.want {
			t.Errorf("Got(%q) = %v, %v; want %q", tt.cc, a, ok, tt.want)
			continue
		}
		if ok && (a.CopyEfficiency < 0.5 || a.CopyEfficiency > 1 || a.Measured) {
			t.Errorf("Got(%q) = %+v; want an assumed efficiency (Measured false) between 0.5 and 1", tt.cc, a)
		}
	}
}

// Each buffer is what was asked for, or a quarter of the free memory in whole MiB when less.
func TestBufferBytes(t *testing.T) {
	const mib = 1 << 20
	for _, tt := range []struct {
		want int64
		free uint64
		got  int64
	}{
		{1 << 30, 80 << 30, 1 << 30},
		{1 << 30, 4 << 30, 1 << 30},
		{1 << 30, 4<<30 - 1, 1023 * mib},
		{16 * mib, 8 * mib, 2 * mib},
		{16 * mib, 9*mib + 5, 2 * mib},
		{16 * mib, 3 * mib, 0},
	} {
		if got := bufferBytes(tt.want, tt.free); got != tt.got {
			t.Errorf("Got(%d, %d) = %v; want %v", tt.want, tt.free, got, tt.got)
		}
	}
}

func TestBatchCopies(t *testing.T) {
	for _, tt := range []struct {
		target, per time.Duration
		want        int
	}{
		{100 * time.Millisecond, time.Millisecond, 100},
		{100 * time.Millisecond, 3 * time.Millisecond, 34},
		{100 * time.Millisecond, time.Second, 1},
		{100 * time.Millisecond, time.Nanosecond, maxBatch},
		{0, time.Millisecond, 1},
		{100 * time.Millisecond, 0, 1},
	} {
		if got := batchCopies(tt.target, tt.per); got != tt.want {
			t.Errorf("Got(%v, %v) = %v; want %v", tt.target, tt.per, got, tt.want)
		}
	}
}

// The 2× convention: a copy reads and writes every byte.
func TestBandwidth(t *testing.T) {
	if got, want := bandwidth(1<<30, 1000, time.Second), 2*float64(1<<30)*1000; got != want {
		t.Errorf("Got(1 GiB × 1000 in 1 s) = %v; want %v", got, want)
	}
	if got := bandwidth(1<<30, 0, time.Second); got != 0 {
		t.Errorf("Got(no copies) = %v; want 0", got)
	}
}

func TestOptionsDefaults(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil || o.Bytes != DefaultBytes || o.Duration != DefaultDuration {
		t.Errorf("Got(Options{}) = %+v, %v; want the defaults", o, err)
	}
	for _, bad := range []Options{{Bytes: MinBytes - 1}, {Duration: -time.Second}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("Got(%+v) = nil error; want one", bad)
		}
	}
}

func TestErrorText(t *testing.T) {
	for _, tt := range []struct {
		e    Error
		want string
	}{
		{Error{Call: "cuMemAlloc_v2", Result: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Text: "out of memory"}, "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"},
		{Error{Call: "cuInit", Result: 12345}, "cuInit: CUresult 12345"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Got(%q) = %v; want %v", tt.e.Call, got, tt.want)
		}
	}
}
