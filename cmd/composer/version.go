package main

import (
	"fmt"
	"runtime/debug"

	"github.com/composer-dev/composer/migrations"
)

// versionLine describes the build: the module version, the commit it was
// built from (and whether the tree was modified), the Go release, and the
// schema version its migrations reach.
func versionLine() string {
	version, commit, when, dirty, goVersion := "(devel)", "unknown", "", false, "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if v := bi.Main.Version; v != "" {
			version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if dirty {
		commit += "+modified"
	}
	if when != "" {
		commit += " " + when
	}
	return fmt.Sprintf("composer %s (commit %s, %s), schema %d", version, commit, goVersion, migrations.Latest())
}
