//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package pgcluster

import (
	"os"
	"os/user"
	"strconv"
	"syscall"

	"github.com/cockroachdb/errors"
)

const supported = true

// serverUser returns the OS user to run initdb and postgres as: nil (the
// current user) unless the process runs as root, which PostgreSQL refuses.
func serverUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.Wrap(err, "pgcluster: running as root, which PostgreSQL refuses, "+
			"and there is no \"postgres\" OS user to run the server as "+
			"(create one, e.g. useradd --system postgres, or run as a non-root user)")
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, errors.Newf("pgcluster: cannot parse uid %q / gid %q of OS user postgres", u.Uid, u.Gid)
	}
	if uid == 0 {
		return nil, errors.New("pgcluster: the \"postgres\" OS user is root; PostgreSQL refuses to run as root")
	}
	return &osUser{name: u.Username, uid: uint32(uid), gid: uint32(gid)}, nil
}

// procAttr puts the child in its own process group, runs it as u (when not
// nil) and, on Linux, has the kernel send it deathSig when this process dies.
func procAttr(u *osUser, deathSig syscall.Signal) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	setDeathSignal(a, deathSig)
	return a
}

func chown(path string, u *osUser) error {
	if u == nil {
		return nil
	}
	return errors.Wrapf(os.Chown(path, int(u.uid), int(u.gid)), "pgcluster: give %s to OS user %s", path, u.name)
}

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }

// alive reports whether a process with this pid exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return (err == nil || errors.Is(err, syscall.EPERM)) && !zombie(pid)
}

// tryLock takes an exclusive flock on f without waiting; false means another
// open file description holds it.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}
