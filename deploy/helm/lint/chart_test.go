// Package lint renders deploy/helm/composer with Helm's own template
// engine, without a cluster, and checks the manifests it produces.
package lint

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const repo = "../../.."

type manifest struct {
	file string
	doc  map[string]any
}

func (m manifest) kind() string { s, _ := m.doc["kind"].(string); return s }
func (m manifest) name() string { s, _ := dig(m.doc, "metadata", "name").(string); return s }

func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func load(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(repo + "/deploy/helm/composer")
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("chart metadata: %v", err)
	}
	return c
}

// render renders the chart as `helm template` would for an install, with
// overrides on top of values.yaml.
func render(c *chart.Chart, overrides map[string]any) ([]manifest, error) {
	vals, err := chartutil.ToRenderValues(c, overrides, chartutil.ReleaseOptions{Name: "composer", Namespace: "composer",
		Revision: 1, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(c, vals)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []manifest
	for _, n := range names {
		if !strings.HasSuffix(n, ".yaml") {
			continue
		}
		dec := utilyaml.NewYAMLReader(bufioReader(files[n]))
		for {
			raw, err := dec.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", n, err)
			}
			if len(bytes.TrimSpace(stripComments(raw))) == 0 {
				continue
			}
			var doc map[string]any
			if err := yaml.UnmarshalStrict(raw, &doc); err != nil {
				return nil, fmt.Errorf("%s: not YAML: %w\n%s", n, err, raw)
			}
			out = append(out, manifest{file: n, doc: doc})
		}
	}
	return out, nil
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// configVars are the environment variables internal/config reads.
func configVars(t *testing.T) []string {
	b, err := os.ReadFile(repo + "/internal/config/config.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`"(COMPOSER_[A-Z0-9_]+)"`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// endpoints are the paths the server's HTTP handlers serve.
func endpoints(t *testing.T) []string {
	b, err := os.ReadFile(repo + "/internal/app/app.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`"GET (/[a-z/.]+)"`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// gauges are the Prometheus names of the server's observable gauges
// (OpenTelemetry's dots become underscores).
func gauges(t *testing.T) []string {
	b, err := os.ReadFile(repo + "/engine/metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`ObservableGauge\("([a-z._]+)"`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, strings.ReplaceAll(m[1], ".", "_"))
	}
	return out
}

var variants = map[string]map[string]any{
	"defaults": nil,
	"jwks, fixed workers": {"jwks": map[string]any{"existingSecret": "idp-keys"},
		"worker": map[string]any{"autoscaling": map[string]any{"enabled": false}}},
}

func TestChartRendersValidManifests(t *testing.T) {
	c := load(t)
	vars, paths, metrics := configVars(t), endpoints(t), gauges(t)
	if len(vars) < 20 || !slices.Contains(paths, "/readyz") || !slices.Contains(paths, "/healthz") || len(metrics) == 0 {
		t.Fatalf("could not read the repository's settings (%d), endpoints (%v) or gauges (%v)", len(vars), paths, metrics)
	}
	for name, overrides := range variants {
		t.Run(name, func(t *testing.T) {
			ms, err := render(c, overrides)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			kinds := map[string][]string{}
			for _, m := range ms {
				for _, f := range []string{"apiVersion", "kind"} {
					if s, _ := m.doc[f].(string); s == "" {
						t.Errorf("%s: a document without %s", m.file, f)
					}
				}
				if m.name() == "" {
					t.Errorf("%s: a %s without metadata.name", m.file, m.kind())
				}
				kinds[m.kind()] = append(kinds[m.kind()], m.name())
				checkPods(t, m, vars, paths)
			}
			for kind, n := range map[string]int{"Deployment": 2, "Job": 1, "Service": 2, "PodDisruptionBudget": 2} {
				if len(kinds[kind]) != n {
					t.Errorf("%d %s, want %d: %v", len(kinds[kind]), kind, n, kinds[kind])
				}
			}
			for _, m := range ms {
				switch m.kind() {
				case "Job":
					if hook, _ := dig(m.doc, "metadata", "annotations", "helm.sh/hook").(string); hook != "pre-install,pre-upgrade" {
						t.Errorf("the migration job is not a pre-install/pre-upgrade hook: %q", hook)
					}
					if args := fmt.Sprint(dig(m.doc, "spec", "template", "spec", "containers", 0, "args")); args != "[migrate]" {
						t.Errorf("the migration job runs %s", args)
					}
				case "HorizontalPodAutoscaler":
					metric, _ := dig(m.doc, "spec", "metrics", 0, "external", "metric", "name").(string)
					if !slices.Contains(metrics, metric) {
						t.Errorf("the HPA scales on %q, which the server does not export (it exports %v)", metric, metrics)
					}
				case "Deployment":
					if strings.HasSuffix(m.name(), "-server") {
						if r, _ := dig(m.doc, "spec", "replicas").(float64); r < 2 {
							t.Errorf("the server runs %v replicas, want at least 2", r)
						}
					}
				}
			}
			t.Logf("rendered %d manifests: %v", len(ms), kinds)
			hpa := len(kinds["HorizontalPodAutoscaler"])
			if want := map[bool]int{true: 1, false: 0}[overrides == nil]; hpa != want {
				t.Errorf("%d HPAs, want %d", hpa, want)
			}
		})
	}
}

// checkPods checks a workload's containers: development off, secrets from
// a Secret, every variable one internal/config reads, probes on served
// endpoints and declared ports.
func checkPods(t *testing.T, m manifest, vars, paths []string) {
	t.Helper()
	spec, _ := dig(m.doc, "spec", "template", "spec").(map[string]any)
	if spec == nil {
		return
	}
	containers, _ := spec["containers"].([]any)
	for _, ci := range containers {
		c, _ := ci.(map[string]any)
		where := m.file + ": " + fmt.Sprint(c["name"])
		env, _ := c["env"].([]any)
		dev := ""
		for _, ei := range env {
			e, _ := ei.(map[string]any)
			name, _ := e["name"].(string)
			if !slices.Contains(vars, name) {
				t.Errorf("%s sets %s, which internal/config does not read", where, name)
			}
			if name == "COMPOSER_DEV" {
				dev, _ = e["value"].(string)
			}
			if strings.Contains(name, "TOKEN") || strings.Contains(name, "KEY") || strings.Contains(name, "PASSWORD") || strings.Contains(name, "DATABASE_URL") {
				t.Errorf("%s sets the secret %s in the manifest; it belongs in existingSecret", where, name)
			}
		}
		if dev != "false" {
			t.Errorf("%s: COMPOSER_DEV is %q, want false", where, dev)
		}
		if ref, _ := dig(c, "envFrom", 0, "secretRef", "name").(string); ref == "" {
			t.Errorf("%s: secrets do not come from a Secret (envFrom)", where)
		}
		ports := map[string]bool{}
		for _, pi := range asList(c["ports"]) {
			if n, _ := dig(pi, "name").(string); n != "" {
				ports[n] = true
			}
		}
		for _, probe := range []string{"readinessProbe", "livenessProbe"} {
			p := dig(c, probe, "httpGet")
			if p == nil {
				if strings.HasSuffix(m.name(), "-server") {
					t.Errorf("%s has no %s", where, probe)
				}
				continue
			}
			path, _ := dig(p, "path").(string)
			want := map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"}[probe]
			if path != want || !slices.Contains(paths, path) {
				t.Errorf("%s: %s on %q, want %s (served: %v)", where, probe, path, want, paths)
			}
			if port, _ := dig(p, "port").(string); !ports[port] {
				t.Errorf("%s: %s on port %q, not a declared port", where, probe, port)
			}
		}
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }

// TestChartRefusesAnInstallWithoutItsSecret: no existingSecret, no render.
func TestChartRefusesAnInstallWithoutItsSecret(t *testing.T) {
	if _, err := render(load(t), map[string]any{"existingSecret": ""}); err == nil || !strings.Contains(err.Error(), "existingSecret") {
		t.Fatalf("rendered without existingSecret (err %v)", err)
	}
}

// TestDeployFilesUseRealSettings: every COMPOSER_ variable the compose
// files and the env template name is one internal/config reads.
func TestDeployFilesUseRealSettings(t *testing.T) {
	vars := configVars(t)
	for _, f := range []string{"deploy/docker-compose.prod.yml", "deploy/composer.env.example", "docker-compose.yml"} {
		b, err := os.ReadFile(repo + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`\b(COMPOSER_[A-Z0-9_]+)\b`).FindAllStringSubmatch(string(b), -1) {
			if !slices.Contains(vars, m[1]) && !strings.HasSuffix(m[1], "_PASSWORD") {
				t.Errorf("%s names %s, which internal/config does not read", f, m[1])
			}
		}
	}
}
