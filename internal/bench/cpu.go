package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// selfCPU is this process's CPU time so far (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is Linux's USER_HZ, the unit of /proc/<pid>/stat times.
const clockTick = 10 * time.Millisecond

// postgresCPU is the CPU time of the local PostgreSQL cluster so far: the
// postmaster's reaped children (every backend that exited, such as the
// pools' connections the counters close) and its live ones. It reads
// /proc, so it is 0 when the server is not on this machine or /proc is
// not readable; the figure is then left out rather than guessed.
func postgresCPU(ctx context.Context, e *env) time.Duration {
	var backend int
	if err := e.deps.DB.System().QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0
	}
	st, ok := procStat(backend)
	if !ok {
		return 0
	}
	postmaster := st.ppid
	pm, ok := procStat(postmaster)
	if !ok {
		return 0
	}
	total := pm.childTicks
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if s, ok := procStat(pid); ok && s.ppid == postmaster {
			total += s.ticks
		}
	}
	return time.Duration(total) * clockTick
}

// processCPU is a process's user and system CPU time so far.
func processCPU(pid int) (time.Duration, error) {
	s, ok := procStat(pid)
	if !ok {
		return 0, fmt.Errorf("cannot read /proc/%d/stat", pid)
	}
	return time.Duration(s.ticks) * clockTick, nil
}

type stat struct {
	ppid       int
	ticks      int64 // utime + stime
	childTicks int64 // cutime + cstime
}

// procStat reads /proc/<pid>/stat: after the command name in parentheses,
// field 4 is the parent pid and fields 14-17 utime, stime, cutime, cstime.
func procStat(pid int) (stat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return stat{}, false
	}
	num := func(k int) int64 { n, _ := strconv.ParseInt(f[k-3], 10, 64); return n }
	return stat{ppid: int(num(4)), ticks: num(14) + num(15), childTicks: num(16) + num(17)}, true
}
