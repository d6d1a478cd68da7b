package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// CompareOptions configures a same-run comparison of two binaries.
type CompareOptions struct {
	// Current and Baseline are composer binaries; each round runs
	// `<binary> bench -scenarios … -scale … -out …` as a child process.
	Current, Baseline string
	// BaselineName says what the baseline is (a commit), for the report.
	BaselineName string
	Scenarios    []string
	// Pairs is the number of (baseline, current) pairs, run in ABBA order
	// (baseline first in even pairs, current first in odd ones) so that a
	// drift of the machine over the run weighs on both sides alike.
	Pairs int
	Scale float64
	// Dir receives each round's JSON report.
	Dir string
	// Log receives the children's output.
	Log io.Writer
}

// Metric is one figure compared across the rounds.
type Metric struct {
	Name     string    `json:"name"`
	Baseline []float64 `json:"baseline"`
	Current  []float64 `json:"current"`
	// Ratios are current/baseline per pair; Median is their median (0
	// when the baseline binary does not report the figure).
	Ratios []float64 `json:"ratios"`
	Median float64   `json:"median_ratio"`
}

// ScenarioComparison is one scenario's metrics.
type ScenarioComparison struct {
	Scenario string   `json:"scenario"`
	Metrics  []Metric `json:"metrics"`
}

// Comparison is the result of Compare.
type Comparison struct {
	When      time.Time            `json:"when"`
	Baseline  string               `json:"baseline"`
	Order     []string             `json:"order"`
	Scenarios []ScenarioComparison `json:"scenarios"`
}

// compared are the metrics a comparison reports, read off a Result.
var compared = []struct {
	name string
	get  func(Result) float64
}{
	{"steps/s", func(r Result) float64 { return r.StepsPerSec }},
	{"handoff p50 ms", func(r Result) float64 { return r.Handoff.P50 }},
	{"handoff p99 ms", func(r Result) float64 { return r.Handoff.P99 }},
	{"run p99 ms", func(r Result) float64 { return r.RunLatency.P99 }},
	{"commits/step", func(r Result) float64 { return r.CommitsPerStep }},
	{"redis cmd/step", func(r Result) float64 { return r.RedisCmdsPerStep }},
	{"CPU ms/step", func(r Result) float64 { return r.CPUPerStepMs }},
	{"PG CPU ms/step", func(r Result) float64 { return r.PGCPUPerStepMs }},
}

// Compare runs the scenarios with both binaries, alternating, and returns
// every round's figures with the per-pair ratios. A round that fails ends
// the comparison with its error.
func Compare(ctx context.Context, o CompareOptions) (Comparison, error) {
	if o.Pairs <= 0 {
		o.Pairs = 2
	}
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Comparison{}, err
	}
	cmp := Comparison{When: time.Now().UTC(), Baseline: o.BaselineName}
	// results[side][pair] by scenario; side 0 baseline, 1 current.
	results := [2][]map[string]Result{make([]map[string]Result, o.Pairs), make([]map[string]Result, o.Pairs)}
	for pair := 0; pair < o.Pairs; pair++ {
		order := []int{0, 1}
		if pair%2 == 1 {
			order = []int{1, 0}
		}
		for _, side := range order {
			bin, label := o.Baseline, "baseline"
			if side == 1 {
				bin, label = o.Current, "current"
			}
			cmp.Order = append(cmp.Order, label)
			out := filepath.Join(o.Dir, fmt.Sprintf("round-%d-%s.json", len(cmp.Order), label))
			fmt.Fprintf(o.Log, "bench compare: round %d (%s): %s\n", len(cmp.Order), label, bin)
			rep, err := runRound(ctx, bin, o, out)
			if err != nil {
				return cmp, fmt.Errorf("round %d (%s): %w", len(cmp.Order), label, err)
			}
			byName := map[string]Result{}
			for _, r := range rep.Results {
				byName[r.Scenario] = r
			}
			results[side][pair] = byName
		}
	}
	for _, name := range o.Scenarios {
		sc := ScenarioComparison{Scenario: name}
		for _, m := range compared {
			met := Metric{Name: m.name}
			for pair := 0; pair < o.Pairs; pair++ {
				b, okB := results[0][pair][name]
				c, okC := results[1][pair][name]
				if !okB || !okC {
					continue
				}
				bv, cv := m.get(b), m.get(c)
				met.Baseline, met.Current = append(met.Baseline, bv), append(met.Current, cv)
				if bv > 0 && cv > 0 {
					met.Ratios = append(met.Ratios, cv/bv)
				}
			}
			if len(met.Ratios) > 0 {
				met.Median = median(met.Ratios)
			} else if !anyPositive(met.Current) {
				continue // a figure neither side reports here
			}
			sc.Metrics = append(sc.Metrics, met)
		}
		cmp.Scenarios = append(cmp.Scenarios, sc)
	}
	return cmp, nil
}

func runRound(ctx context.Context, bin string, o CompareOptions, out string) (Report, error) {
	cmd := exec.CommandContext(ctx, bin, "bench", "-scenarios", strings.Join(o.Scenarios, ","), "-scale", fmt.Sprint(o.Scale), "-out", out)
	cmd.Stdout, cmd.Stderr = o.Log, o.Log
	if err := cmd.Run(); err != nil {
		return Report{}, err
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return Report{}, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return Report{}, fmt.Errorf("read %s: %w", out, err)
	}
	return rep, nil
}

func anyPositive(xs []float64) bool {
	for _, x := range xs {
		if x > 0 {
			return true
		}
	}
	return false
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Print writes the comparison as a table: every round's figure on each
// side, the per-pair ratios (current/baseline) and their median.
func (c Comparison) Print(w io.Writer) {
	fmt.Fprintf(w, "current against baseline %s, rounds in order %s\n", c.Baseline, strings.Join(c.Order, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\tmetric\tbaseline\tcurrent\tpair ratios\tmedian\n")
	for _, sc := range c.Scenarios {
		for _, m := range sc.Metrics {
			med := "—"
			if m.Median > 0 {
				med = fmt.Sprintf("%.3f×", m.Median)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sc.Scenario, m.Name, floats(m.Baseline), floats(m.Current), floats(m.Ratios), med)
		}
	}
	tw.Flush()
}

func floats(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		switch {
		case x >= 100:
			parts[i] = fmt.Sprintf("%.0f", x)
		case x >= 1:
			parts[i] = fmt.Sprintf("%.2f", x)
		default:
			parts[i] = fmt.Sprintf("%.3f", x)
		}
	}
	return strings.Join(parts, " ")
}

// Save writes the comparison as JSON.
func (c Comparison) Save(path string) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
