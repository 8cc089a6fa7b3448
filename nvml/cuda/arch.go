package cuda

// Arch is a GPU architecture and the share of its theoretical peak memory bandwidth that the
// probe's device-to-device copies reach on a healthy GPU.
type Arch struct {
	// Name is the architecture: "Hopper".
	Name string
	// CopyEfficiency is the achieved bandwidth of Probe (counted the 2× way, see
	// DeviceResult.BytesPerSecond) over the theoretical peak (NVML's maximum memory clock ×
	// 2 × bus width), on a healthy GPU: a GPU alone of its model is judged against peak ×
	// CopyEfficiency, since it has no peers.
	CopyEfficiency float64
	// Measured is false while CopyEfficiency is an assumption rather than a measurement.
	Measured bool
}

// archKey is a compute capability; a minor of -1 stands for every minor of the major.
type archKey struct{ major, minor int }

// arches are the architectures by compute capability.
//
// Every CopyEfficiency here is an ASSUMPTION, not a measurement: 0.80, from the A100 80GB,
// whose 2039 GB/s peak gives about 1.6 TB/s in a device-to-device copy on a good part. None
// has been measured with this probe yet (no GPU was at hand when it was written); the Hopper
// row is to be measured on an H200 when a device is available, and each row set Measured when
// it has been. A GPU with peers is judged against them, never against this table.
var arches = map[archKey]Arch{
	{7, 0}:   {Name: "Volta", CopyEfficiency: 0.80},
	{7, 2}:   {Name: "Volta", CopyEfficiency: 0.80}, // Xavier
	{7, 5}:   {Name: "Turing", CopyEfficiency: 0.80},
	{8, 0}:   {Name: "Ampere", CopyEfficiency: 0.80},
	{8, 6}:   {Name: "Ampere", CopyEfficiency: 0.80},
	{8, 7}:   {Name: "Ampere", CopyEfficiency: 0.80}, // Orin
	{8, 9}:   {Name: "Ada", CopyEfficiency: 0.80},
	{9, 0}:   {Name: "Hopper", CopyEfficiency: 0.80}, // to be measured on an H200
	{10, -1}: {Name: "Blackwell", CopyEfficiency: 0.80},
	{12, -1}: {Name: "Blackwell", CopyEfficiency: 0.80},
}

// ArchOf returns the architecture of compute capability major.minor, and false when this
// package does not know it (older than Volta, or newer than it).
func ArchOf(major, minor int) (Arch, bool) {
	if a, ok := arches[archKey{major, minor}]; ok {
		return a, true
	}
	a, ok := arches[archKey{major, -1}]
	return a, ok
}
