package main

import (
	"context"
	"flag"
	"os"
	"runtime/pprof"
	"strings"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/bench"
)

// runBench runs the end-to-end benchmarks against the local PostgreSQL and
// Redis (see docs/benchmarks.md).
func runBench(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	scenarios := fs.String("scenarios", "", "comma-separated scenarios (default all: "+strings.Join(bench.All, ",")+")")
	scale := fs.Float64("scale", 1, "multiply every scenario's step count")
	out := fs.String("out", "bench-results.json", "where to write the JSON report")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	log := env.log
	if env.cfg.LogLevel != "debug" {
		log = zap.NewNop()
	}
	rep, err := bench.Run(ctx, bench.Options{Config: env.cfg, Scenarios: splitList(*scenarios), Scale: *scale, Out: *out, Log: log})
	rep.Print(os.Stdout)
	if err == nil {
		env.log.Info("report written", zap.String("path", *out))
	}
	return err
}
