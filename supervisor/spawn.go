package supervisor

import (
	"os/exec"
	"runtime"
	"sync"
)

// Workers are started with Pdeathsig=SIGKILL so they die with the
// supervisor even when it is SIGKILLed. Linux sends the parent-death signal
// when the *thread* that forked the child exits, not the process; the Go
// runtime may retire threads (for example one whose goroutine locked it and
// returned), which would kill healthy workers. So every fork happens on one
// goroutine locked to its OS thread for the life of the process: that
// thread never exits before the process does.
type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

func startOnSpawnerThread(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawnCh {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd, done}
	return <-done
}
