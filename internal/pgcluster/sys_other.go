//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package pgcluster

import (
	"os"
	"syscall"

	"github.com/cockroachdb/errors"
)

const supported = false

func serverUser() (*osUser, error) { return nil, nil }

func procAttr(*osUser, syscall.Signal) *syscall.SysProcAttr { return nil }

func chown(string, *osUser) error { return nil }

func signalGroup(int, syscall.Signal) error { return errors.New("pgcluster: unsupported platform") }

func alive(int) bool { return true }

func tryLock(*os.File) (bool, error) { return false, nil }
func groupAlive(int) bool            { return false }
func shmAttached(int) bool           { return false }
