package proxybench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports (sysconf(_SC_CLK_TCK) needs cgo).
const clockTicks = 100

// cpuTime is the user plus system CPU time a process has used so far, read
// from /proc/<pid>/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("proxybench: cpu time of pid %d: %w", pid, err)
	}
	return parseStat(b)
}

// parseStat returns utime+stime (fields 14 and 15 of proc(5)) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may itself hold spaces and parentheses, so fields are counted from the
// last ')'.
func parseStat(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("proxybench: /proc stat line without a command name: %.40q", b)
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		return 0, fmt.Errorf("proxybench: /proc stat line has %d fields after the name, want at least %d", len(f), stime+1)
	}
	var ticks int64
	for _, s := range [][]byte{f[utime], f[stime]} {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("proxybench: /proc stat cpu field %q: not a tick count", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
