package pgcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/internal/errmark"
)

// ErrNoBinaries is returned (wrapped) by [FindBinaries] and [Start] when no
// directory holds both initdb and postgres.
var ErrNoBinaries = errors.New("PostgreSQL server binaries not found")

// InstallHint says how to install the PostgreSQL server binaries.
const InstallHint = "Debian/Ubuntu: apt-get install -y postgresql; " +
	"Fedora: dnf install -y postgresql-server; macOS: brew install postgresql"

// debianGlob is where Debian and Ubuntu install each major version.
const debianGlob = "/usr/lib/postgresql/*/bin"

// FindBinaries returns the directory that holds initdb and postgres: the
// directory of the initdb found on PATH (symlinks resolved) when postgres is
// beside it, else the highest version under /usr/lib/postgresql/*/bin.
func FindBinaries() (dir string, err error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if d := filepath.Dir(p); hasServerBinaries(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob(debianGlob) // the pattern is valid
	sort.Slice(dirs, func(i, j int) bool { return versionLess(dirs[j], dirs[i]) })
	for _, d := range dirs {
		if hasServerBinaries(d) {
			return d, nil
		}
	}
	return "", errmark.Mark(errors.Newf(
		"pgcluster: no PostgreSQL server binaries (initdb and postgres) on PATH or under %s; install them (%s)",
		debianGlob, InstallHint), ErrNoBinaries)
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionLess compares the version directories of two .../postgresql/V/bin
// paths numerically ("9.6" < "10" < "15").
func versionLess(a, b string) bool {
	va := strings.Split(filepath.Base(filepath.Dir(a)), ".")
	vb := strings.Split(filepath.Base(filepath.Dir(b)), ".")
	for i := 0; i < len(va) && i < len(vb); i++ {
		na, ea := strconv.Atoi(va[i])
		nb, eb := strconv.Atoi(vb[i])
		if ea != nil || eb != nil {
			if va[i] != vb[i] {
				return va[i] < vb[i]
			}
			continue
		}
		if na != nb {
			return na < nb
		}
	}
	return len(va) < len(vb)
}
