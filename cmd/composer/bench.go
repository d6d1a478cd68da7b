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
	baseline := fs.String("baseline", "", "compare with this composer binary: both run the scenarios, alternating (ABBA), and the per-pair ratios are printed")
	baselineName := fs.String("baseline-name", "", "what the baseline binary is (its commit), for the report")
	pairs := fs.Int("pairs", 2, "with -baseline: the number of (baseline, current) pairs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *baseline != "" {
		return compareBench(ctx, env, *baseline, *baselineName, splitList(*scenarios), *scale, *pairs, *out)
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

// compareBench runs the scenarios with this binary and a baseline one,
// alternating, and prints and saves the ratios.
func compareBench(ctx context.Context, env *environment, baseline, name string, scenarios []string, scale float64, pairs int, out string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if len(scenarios) == 0 {
		scenarios = bench.StepPath
	}
	if name == "" {
		name = baseline
	}
	dir, err := os.MkdirTemp("", "composer-bench-compare-")
	if err != nil {
		return err
	}
	res, err := bench.Compare(ctx, bench.CompareOptions{Current: self, Baseline: baseline, BaselineName: name, Scenarios: scenarios,
		Pairs: pairs, Scale: scale, Dir: dir, Log: os.Stderr})
	res.Print(os.Stdout)
	if err != nil {
		return err
	}
	if err := res.Save(out); err != nil {
		return err
	}
	env.log.Info("comparison written", zap.String("path", out), zap.String("rounds", dir))
	return nil
}
