package replica

import "runtime"

// HeapInUse is the live heap after a collection (exported for the
// external test package).
func HeapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
