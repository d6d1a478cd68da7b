package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/testenv"
)

// gqlCall posts one GraphQL request as credential and decodes data into
// out; it fails the test on any error.
func gqlCall(t *testing.T, base, credential, query string, vars map[string]any, out any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, base+"/graphql", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+credential)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var res struct {
		Data   json.RawMessage
		Errors []json.RawMessage
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&res))
	require.Empty(t, res.Errors, "%s", query)
	if out != nil {
		require.NoError(t, json.Unmarshal(res.Data, out))
	}
}

// devSession asks a `composer dev` for the demo owner's token, as the
// console's one-click sign-in does.
func devSession(t *testing.T, base string) (s struct {
	Token    string `json:"token"`
	TenantID string `json:"tenant_id"`
}) {
	t.Helper()
	resp, err := http.Post(base+app.PathDevSession, "application/json", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	require.NotEmpty(t, s.Token)
	return s
}

// browser starts headless Chromium with the flags a closed network needs,
// a fresh profile and a window of width × height, and returns a context
// for chromedp actions.
func browser(t *testing.T, width, height int) context.Context {
	t.Helper()
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		t.Fatalf("Chromium is not installed (/usr/bin/chromium): run scripts/services.sh")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath("/usr/bin/chromium"),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(width, height),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelB := chromedp.NewContext(actx)
	// The browser starts on a context without a deadline (a deadline on the
	// first call would be the browser's); the test's deadline comes after.
	require.NoError(t, chromedp.Do(bctx))
	t.Cleanup(func() { cancelB(); cancelA() })
	return bctx
}

// run runs browser steps in order, each call within 30 s, and fails the
// test at the first error with what the page shows then.
func run(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		page, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 3000)`))
		t.Fatalf("browser: %v\npage: %s", err, page)
	}
}

func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

func js(expr string) chromedp.Action[chromedp.Void] { return chromedp.Evaluate[chromedp.Void](expr) }

// into is an action that keeps what a valued action returns.
func into[T any](out *T, a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		v, err := a(ctx, tg)
		*out = v
		return chromedp.Void{}, err
	}
}

func evalInto[T any](out *T, expr string) chromedp.Action[chromedp.Void] {
	return into(out, chromedp.Evaluate[T](expr))
}

// lowContrast lists the text elements of the page whose colour against
// their background is below WCAG AA's 4.5:1.
const lowContrast = `(() => {
  const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const bg = (el) => { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor); if (c.length === 3 || c[3] > 0.5) return c; } return [255, 255, 255]; };
  const out = [];
  for (const el of document.querySelectorAll('main *, header *')) {
    if (!el.childNodes.length || ![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    if (el.closest('svg') || el.offsetParent === null) continue;
    const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) out.push(el.tagName + '.' + el.className + ' "' + el.textContent.trim().slice(0, 30) + '" ' + ratio.toFixed(2));
  }
  return out;
})()`

// screenshot saves the page as name.png in $COMPOSER_SCREENSHOTS (a path
// relative to the repository, as `make` runs it), when that is set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	shots := os.Getenv("COMPOSER_SCREENSHOTS")
	if shots == "" {
		return
	}
	if !filepath.IsAbs(shots) {
		shots = filepath.Join("..", shots)
	}
	var png []byte
	run(t, ctx, js(`document.getElementById('toasts')?.remove()`), into(&png, chromedp.CaptureScreenshot()))
	require.NoError(t, os.MkdirAll(shots, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
}

// unlabelledControls lists the form controls of the page with neither a
// label nor an aria-label.
const unlabelledControls = `[...document.querySelectorAll('input, select, textarea')].filter(el =>
	!(el.labels && el.labels.length) && !el.getAttribute('aria-label')).map(el => el.outerHTML)`

// clickInRow clicks the element matching sel in the first table row whose
// text passes the JavaScript predicate match (of tr), once such a row is
// on the page: a table re-rendered after an action is waited for, not
// raced.
func clickInRow(rows, match, sel string) chromedp.Action[chromedp.Void] {
	return poll(fmt.Sprintf(`(() => { const tr = [...document.querySelectorAll(%q)].find(tr => %s);
		const el = tr && tr.querySelector(%q); if (!el) return false; el.click(); return true; })()`, rows, match, sel))
}

// poll waits until the JavaScript expression is truthy.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))
}

const approvalDef = `{"nodes": [
  {"id": "prepare", "type": "noop"},
  {"id": "approve", "type": "wait", "depends_on": ["prepare"], "wait": {"signal": "approval", "approval": true, "timeout": "1h"}},
  {"id": "ship", "type": "noop", "depends_on": ["approve"]},
  {"id": "notify", "type": "noop", "depends_on": ["approve"]}
]}`

// TestConsoleInTheBrowser drives the console of a real `composer dev` in
// headless Chromium: one-click demo sign-in, a workflow created with its
// validation problem shown on the node, a run started, approved and seen
// turning green live, another cancelled, a version diff, a viewer without
// action buttons, a revoked key signed out, and a 100-node run's render
// time. With COMPOSER_SCREENSHOTS=dir it saves the main pages as PNGs.
func TestConsoleInTheBrowser(t *testing.T) {
	env := testenv.New(t)
	base, _ := startDev(t, env)
	shot := func(ctx context.Context, name string) { screenshot(t, ctx, name) }

	// The owner token the test itself uses, from the same dev endpoint.
	session := devSession(t, base)
	owner := session.Token

	ctx := browser(t, 1440, 900)
	began := time.Now()

	// Sign in with one click as the demo owner; the credential is in
	// sessionStorage, not in the URL.
	var url, stored string
	run(t, ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(css("#demo-signin")),
		chromedp.Click(css("#demo-signin")),
		chromedp.WaitVisible(css("#start-run")),
		into(&url, chromedp.Location()),
		evalInto(&stored, `sessionStorage.getItem('composer.credential')`),
	)
	assert.Equal(t, base+"/runs", url)
	assert.NotEmpty(t, stored)
	assert.NotContains(t, url, stored)

	// Create a workflow in the editor: a bad expression is a problem shown
	// on the node it names; fixed, it is created.
	bad := strings.Replace(approvalDef, `"id": "ship", "type": "noop"`, `"id": "ship", "type": "noop", "if": "nope(("`, 1)
	run(t, ctx,
		chromedp.Click(css(`a[href="/workflows"]`)),
		chromedp.WaitVisible(css("#new-workflow")),
		chromedp.Click(css("#new-workflow")),
		chromedp.WaitVisible(css("#wf-def")),
		chromedp.SetValue(css("#wf-name"), "orders"),
		chromedp.SetValue(css("#wf-def"), bad),
		chromedp.Click(css("#wf-submit")),
		poll(`!!document.querySelector('#preview .node.problem[data-node="ship"]') && !document.querySelector('#preview .node.problem[data-node="prepare"]')`),
		chromedp.WaitVisible(css(`#editor-status .error`)),
		chromedp.SetValue(css("#wf-def"), approvalDef),
		chromedp.Click(css("#wf-submit")),
		chromedp.WaitVisible(css("#publish")),
	)
	var wfs struct {
		Workflows struct {
			Edges []struct{ Node struct{ ID, Name string } }
		}
	}
	gqlCall(t, base, owner, `{ workflows { edges { node { id name } } } }`, nil, &wfs)
	var wfID string
	for _, e := range wfs.Workflows.Edges {
		if e.Node.Name == "orders" {
			wfID = e.Node.ID
		}
	}
	require.NotEmpty(t, wfID)

	// Start a run from the console; it waits for approval and says so.
	run(t, ctx,
		chromedp.Click(css(`a[href="/runs"]`)),
		chromedp.WaitVisible(css("#start-run")),
		chromedp.Click(css("#start-run")),
		chromedp.WaitVisible(css("#f-workflow")),
		chromedp.SetValue(css("#f-workflow"), wfID),
		chromedp.SetValue(css("#f-input"), `{"order": "o-1"}`),
		chromedp.SetValue(css("#f-metadata"), `{"customer": "c_42"}`),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		chromedp.WaitVisible(css(`#waiting button[data-approve="approve"]`)),
		poll(`document.querySelector('#waiting').textContent.includes('waits for an approval') &&
			document.querySelector('#waiting').textContent.includes('times out at')`),
		poll(`document.querySelector('#graph .node[data-node="prepare"]').dataset.state === 'completed'`),
	)
	shot(ctx, "run-waiting")
	// Approve with a comment; the nodes turn green without a reload.
	run(t, ctx,
		js(`window.__sameDocument = true`),
		chromedp.Click(css(`#waiting button[data-approve="approve"]`)),
		chromedp.WaitVisible(css("#f-comment")),
		chromedp.SetValue(css("#f-comment"), "looks good"),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`[...document.querySelectorAll('#graph .node')].every(n => n.dataset.state === 'completed')`),
		poll(`document.querySelector('h1 .badge').textContent === 'completed'`),
	)
	var same bool
	run(t, ctx, evalInto(&same, `window.__sameDocument === true`))
	assert.True(t, same, "the run turned green live, in the same document")
	run(t, ctx,
		chromedp.Click(css(`#graph .node[data-node="approve"]`)),
		poll(`document.querySelector('#node-detail').textContent.includes('looks good')`),
		poll(`document.querySelectorAll('#timeline tbody tr').length >= 5`),
	)
	shot(ctx, "run-graph")
	var lowRun []string
	run(t, ctx, evalInto(&lowRun, lowContrast))
	assert.Empty(t, lowRun, "text below 4.5:1 on the run page")
	// The graph is usable from the keyboard: a focused node opens with Enter.
	run(t, ctx,
		chromedp.Focus(css(`#graph .node[data-node="ship"]`)),
		chromedp.KeyEvent("\r"),
		poll(`document.querySelector('#node-detail h2').textContent.startsWith('ship')`),
		poll(`document.querySelectorAll('#node-detail .attempts li').length >= 2 && !document.querySelector('#node-detail').textContent.includes('null')`),
	)

	// Cancel another run from its page.
	var started struct {
		StartRun struct{ Run struct{ ID string } }
	}
	gqlCall(t, base, owner, `mutation($w: ID!) { startRun(input: {workflowId: $w, metadata: {customer: "c_7"}}) { run { id } } }`, map[string]any{"w": wfID}, &started)
	other := started.StartRun.Run.ID
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/runs/%s')`, other)),
		chromedp.WaitVisible(css("#act-cancel")),
		chromedp.Click(css("#act-cancel")),
		chromedp.WaitVisible(css("#f-reason")),
		chromedp.SetValue(css("#f-reason"), "duplicate order"),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`document.querySelector('h1 .badge').textContent === 'cancelled'`),
		chromedp.WaitVisible(css("#act-rerun")),
	)
	var cancelled struct {
		Run struct{ Status string }
	}
	gqlCall(t, base, owner, `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": other}, &cancelled)
	assert.Equal(t, "CANCELLED", cancelled.Run.Status)
	// Re-run it from its failed (here cancelled) nodes: it waits for approval again.
	run(t, ctx,
		chromedp.Click(css("#act-rerun")),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`document.querySelector('h1 .badge').textContent === 'running'`),
		chromedp.WaitVisible(css(`#waiting button[data-approve="approve"]`)),
	)

	// The runs list, live: a run started elsewhere appears without a reload.
	run(t, ctx,
		js(`composer.navigate('/runs')`),
		chromedp.WaitVisible(css(`#counts-unavailable, .counts .count`)),
	)
	gqlCall(t, base, owner, `mutation($w: ID!) { startRun(input: {workflowId: $w, metadata: {customer: "c_9"}}) { run { id } } }`, map[string]any{"w": wfID}, &started)
	waiting := started.StartRun.Run.ID
	run(t, ctx, poll(fmt.Sprintf(`!!document.querySelector('tr[data-run="%s"]')`, waiting)))
	// Filters: by metadata, and by status.
	run(t, ctx,
		chromedp.SetValue(css("#flt-meta"), "customer=c_7"),
		chromedp.Click(css(`form.filters button[type="submit"]`)),
		poll(fmt.Sprintf(`location.search === '?meta=customer%%3Dc_7' && document.querySelectorAll('tr[data-run]').length === 1 && !!document.querySelector('tr[data-run="%s"]')`, other)),
		js(`composer.navigate('/runs?status=COMPLETED')`),
		poll(`document.querySelectorAll('tr[data-run]').length === 1 && document.querySelector('tr[data-run]').dataset.status === 'COMPLETED'`),
		js(`composer.navigate('/runs')`),
		chromedp.WaitVisible(css(`tr[data-run]`)),
	)
	// Every form control of the page has a label.
	var unlabelled []string
	run(t, ctx, evalInto(&unlabelled, unlabelledControls))
	assert.Empty(t, unlabelled)
	var low []string
	run(t, ctx, evalInto(&low, lowContrast))
	assert.Empty(t, low, "text below 4.5:1 on the runs page")

	// A second version, and the side-by-side diff of the two.
	var def map[string]any
	require.NoError(t, json.Unmarshal([]byte(approvalDef), &def))
	nodes := def["nodes"].([]any)
	nodes[2].(map[string]any)["retry"] = map[string]any{"max_attempts": 3, "backoff": "2s"}
	def["nodes"] = append(nodes, map[string]any{"id": "archive", "type": "noop", "depends_on": []string{"ship", "notify"}})
	gqlCall(t, base, owner, `mutation($w: ID!, $d: JSON!) { publishWorkflowVersion(workflowId: $w, definition: $d) { version } }`, map[string]any{"w": wfID, "d": def}, nil)
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/workflows/%s?a=1&b=2')`, wfID)),
		chromedp.WaitVisible(css("#diff table.diff")),
		poll(`document.querySelectorAll('#diff tr.d-add, #diff tr.d-chg').length > 0 && document.querySelector('#diff-summary').textContent.includes('between v1 and v2')`),
	)
	run(t, ctx, js(`document.querySelector('#diff').closest('section').scrollIntoView()`))
	shot(ctx, "workflow-diff")

	// Webhooks: an endpoint, a test ping and its delivery.
	gqlCall(t, base, owner, `mutation($u: String!) { createWebhookEndpoint(input: {url: $u, eventTypes: ["run.completed", "run.failed"], description: "orders service"}) { endpoint { id } } }`,
		map[string]any{"u": base + "/v1/dev/echo"}, nil)
	run(t, ctx,
		js(`composer.navigate('/admin/webhooks')`),
		chromedp.WaitVisible(css(".endpoint")),
		chromedp.Click(css(`.endpoint .actions button:nth-child(2)`)),
		poll(`[...document.querySelectorAll('#deliveries td')].some(td => td.textContent === 'webhook.test')`),
	)
	shot(ctx, "webhooks")

	// Stats: the last hour in minutes, from runStats: every run started so
	// far is in its bars (recent minutes are read live, not only from the
	// rollups).
	var stats struct {
		RunStats struct{ Buckets []struct{ Started int } }
	}
	gqlCall(t, base, owner, `query($f: Time!, $t: Time!) { runStats(from: $f, to: $t, interval: MINUTE) { buckets { started } } }`,
		map[string]any{"f": time.Now().Add(-time.Hour).Format(time.RFC3339), "t": time.Now().Add(time.Minute).Format(time.RFC3339)}, &stats)
	startedAPI := 0
	for _, b := range stats.RunStats.Buckets {
		startedAPI += b.Started
	}
	require.Positive(t, startedAPI)
	var startedBars int
	run(t, ctx,
		js(`composer.navigate('/stats?range=1h')`),
		chromedp.WaitVisible(css(`#stats svg.chart`)),
		into(&startedBars, chromedp.Evaluate[int](`[...document.querySelectorAll('#stats svg.chart rect.bar.started title')]
			.map(t => parseInt(t.textContent.split(': ')[1], 10)).reduce((a, b) => a + b, 0)`)),
	)
	assert.GreaterOrEqual(t, startedBars, startedAPI, "the chart's started bars hold every run the API counted before")
	shot(ctx, "stats")
	// The runs list's counts by status are runCounts'.
	var counts struct {
		RunCounts []struct {
			Status string
			Count  int
		}
	}
	gqlCall(t, base, owner, `{ runCounts { status count } }`, nil, &counts)
	completed := 0
	for _, c := range counts.RunCounts {
		if c.Status == "COMPLETED" {
			completed = c.Count
		}
	}
	require.Positive(t, completed)
	run(t, ctx,
		js(`composer.navigate('/runs')`),
		poll(fmt.Sprintf(`parseInt((document.querySelector('.counts .count[data-status="COMPLETED"] .n') || {}).textContent, 10) >= %d`, completed)),
	)
	// The chart itself, drawn from buckets shaped as runStats answers them.
	var bars int
	run(t, ctx, into(&bars, chromedp.Evaluate[int](`import('/js/stats.js').then(m => {
		const b = (h, started, p50) => ({start: '2026-12-01T0' + h + ':00:00Z', started, completed: started - 1, failed: 1, cancelled: 0, p50Ms: p50, p95Ms: p50 * 4, failureRate: 1 / started});
		const el = m.chart({interval: 'HOUR', buckets: [b(1, 4, 120), b(2, 9, 80), b(3, 2, null)]});
		return el.querySelectorAll('svg rect.bar').length + 10 * el.querySelectorAll('svg polyline').length;
	})`, chromedp.EvalAwaitPromise)))
	assert.Equal(t, 9+20, bars, "three bars per bucket, a line each for p50 and p95")

	// A run of 100 nodes: the page's render, timed in the browser.
	hundred := map[string]any{}
	var ns []map[string]any
	for layer := 0; layer < 10; layer++ {
		for i := 0; i < 10; i++ {
			n := map[string]any{"id": fmt.Sprintf("n%d_%d", layer, i), "type": "noop"}
			if layer > 0 {
				n["depends_on"] = []string{fmt.Sprintf("n%d_%d", layer-1, i), fmt.Sprintf("n%d_%d", layer-1, (i+3)%10)}
			}
			ns = append(ns, n)
		}
	}
	hundred["nodes"] = ns
	var big struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	gqlCall(t, base, owner, `mutation($d: JSON!) { createWorkflow(input: {name: "hundred", definition: $d}) { workflow { id } } }`, map[string]any{"d": hundred}, &big)
	gqlCall(t, base, owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": big.CreateWorkflow.Workflow.ID}, &started)
	bigRun := started.StartRun.Run.ID
	var renderMs, totalMs float64
	run(t, ctx,
		js(fmt.Sprintf(`window.__t0 = performance.now(); composer.navigate('/runs/%s')`, bigRun)),
		poll(`document.querySelector('main[data-nodes="100"]') && document.querySelectorAll('#graph .node').length === 100`),
		evalInto(&totalMs, `performance.now() - window.__t0`),
		evalInto(&renderMs, `window.composer.lastRenderMs`),
	)
	t.Logf("100-node run page: render %.1f ms (DOM and SVG after the data arrived), %.1f ms from navigation with its two requests", renderMs, totalMs)
	assert.Less(t, renderMs, 200.0)
	run(t, ctx, poll(`[...document.querySelectorAll('#graph .node')].every(n => n.dataset.state === 'completed')`))
	shot(ctx, "run-graph-100")

	// Why a run waits: a sleep until its timer, a handler no worker serves.
	gqlCall(t, base, owner, `mutation($d: JSON!) { createWorkflow(input: {name: "patient", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(`{"nodes": [{"id": "nap", "type": "sleep", "sleep": {"duration": "1h"}},
			{"id": "resize", "type": "task", "task": {"handler": "thumbnails"}}]}`)}, &big)
	gqlCall(t, base, owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": big.CreateWorkflow.Workflow.ID}, &started)
	var why string
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/runs/%s')`, started.StartRun.Run.ID)),
		poll(`(document.querySelector('#waiting') || {textContent: ''}).textContent.includes('sleeps until') &&
			!document.querySelector('#waiting').textContent.includes('its timer fires') &&
			document.querySelector('#waiting').textContent.includes('no connected worker serves the handler “thumbnails”')`),
		into(&why, chromedp.Text(css("#waiting"))),
	)
	t.Logf("why it waits: %s", why)
	run(t, ctx, js(`composer.navigate('/runs')`), poll(`document.querySelectorAll('tr[data-run]').length === 5`))
	shot(ctx, "runs-list")
	// Keyset pages: two at a time, "Load more" follows the end cursor.
	var pages []string
	run(t, ctx,
		js(`composer.navigate('/runs?first=2')`),
		poll(`document.querySelectorAll('tr[data-run]').length === 2 && !document.querySelector('#load-more').hidden`),
		chromedp.Click(css("#load-more")),
		poll(`document.querySelectorAll('tr[data-run]').length === 4`),
		chromedp.Click(css("#load-more")),
		poll(`document.querySelectorAll('tr[data-run]').length === 5 && document.querySelector('#load-more').hidden`),
		evalInto(&pages, `[...document.querySelectorAll('tr[data-run]')].map(tr => tr.dataset.run)`),
	)
	assert.True(t, sort.SliceIsSorted(pages, func(i, j int) bool { return pages[i] > pages[j] }), "newest first, no repeats: %v", pages)

	// An approval with a policy says who may answer it, and the one who
	// started the run finds the buttons disabled and is told why.
	var gated struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	gqlCall(t, base, owner, `mutation($d: JSON!) { createWorkflow(input: {name: "gated", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(`{"nodes": [{"id": "gate", "type": "wait",
			"wait": {"signal": "approval", "approval": true, "approvers": {"roles": ["admin"], "not_starter": true}}}]}`)}, &gated)
	gqlCall(t, base, owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": gated.CreateWorkflow.Workflow.ID}, &started)
	var who, whyNot string
	var disabled bool
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/runs/%s')`, started.StartRun.Run.ID)),
		chromedp.WaitVisible(css(`#waiting [data-who="gate"]`)),
		into(&who, chromedp.Text(css(`#waiting [data-who="gate"]`))),
		into(&whyNot, chromedp.Text(css(`#waiting [data-why-not="gate"]`))),
		evalInto(&disabled, `document.querySelector('#waiting button[data-approve="gate"]').disabled && document.querySelector('#waiting button[data-reject="gate"]').disabled`),
	)
	assert.Equal(t, "Who may approve: members with the admin role, except whoever started the run.", strings.TrimSpace(who))
	assert.Contains(t, whyNot, "started this run, so you may not approve it")
	assert.True(t, disabled, "the starter cannot press approve or reject")

	// API keys from the admin page: created with scopes, the secret shown once, revoked.
	var secret string
	run(t, ctx,
		js(`composer.navigate('/admin/keys')`),
		chromedp.WaitVisible(css("#create-key")),
		chromedp.Click(css("#create-key")),
		chromedp.WaitVisible(css("#f-name")),
		chromedp.SetValue(css("#f-name"), "ci deploys"),
		chromedp.Click(css(`dialog input[value="runs:write"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		chromedp.WaitVisible(css("dialog code.secret")),
		into(&secret, chromedp.Text(css("dialog code.secret"))),
		chromedp.Click(css("dialog .btn.primary")),
		poll(`[...document.querySelectorAll('tr')].some(tr => tr.textContent.includes('ci deploys') && tr.textContent.includes('runs:write'))`),
		clickInRow("tr", `tr.textContent.includes('ci deploys')`, "button[data-revoke]"),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`[...document.querySelectorAll('tr.revoked')].some(tr => tr.textContent.includes('ci deploys'))`),
	)
	assert.True(t, strings.HasPrefix(secret, "cmp_"), "the secret is shown once: %.8s…", secret)

	// A viewer sees no buttons it cannot use.
	viewerSubject := "viewer@example.com"
	gqlCall(t, base, owner, `mutation($s: String!) { addMember(subject: $s, role: VIEWER) { role } }`, map[string]any{"s": viewerSubject}, nil)
	viewer, err := auth.MintDevToken(app.DevJWTSecret, "composer", "composer-api", session.TenantID, viewerSubject, string(auth.RoleViewer), time.Hour)
	require.NoError(t, err)
	var buttons int
	run(t, ctx,
		chromedp.Click(css("#signout")),
		chromedp.WaitVisible(css("#credential")),
		chromedp.SetValue(css("#credential"), viewer),
		chromedp.Click(css("#signin-submit")),
		chromedp.WaitVisible(css(`tr[data-run]`)),
		poll(`!document.querySelector('#start-run')`),
		js(fmt.Sprintf(`composer.navigate('/runs/%s')`, waiting)),
		chromedp.WaitVisible(css("#waiting li")),
		evalInto(&buttons, `document.querySelectorAll('#run-actions button, #waiting button').length`),
	)
	assert.Zero(t, buttons, "a viewer has no action buttons on a waiting run")
	var navText string
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/workflows/%s')`, wfID)),
		chromedp.WaitVisible(css("#diff")),
		evalInto(&buttons, `document.querySelectorAll('#publish, #new-workflow').length`),
		into(&navText, chromedp.Text(css("header nav"))),
	)
	assert.Zero(t, buttons, "a viewer cannot publish")
	run(t, ctx,
		js(`composer.navigate('/admin/usage')`),
		chromedp.WaitVisible(css(".tab-body .card")),
		evalInto(&buttons, `document.querySelectorAll('.tabs a').length`),
	)
	assert.Equal(t, 1, buttons, "a viewer's admin shows usage and limits only")

	// A revoked key is signed out of the console.
	var key struct {
		CreateApiKey struct {
			ApiKey struct{ ID string }
			Secret string
		}
	}
	gqlCall(t, base, owner, `mutation { createApiKey(input: {name: "dashboard", scopes: ["runs:read", "workflows:read"]}) { apiKey { id } secret } }`, nil, &key)
	run(t, ctx,
		chromedp.Click(css("#signout")),
		chromedp.WaitVisible(css("#credential")),
		chromedp.SetValue(css("#credential"), key.CreateApiKey.Secret),
		chromedp.Click(css("#signin-submit")),
		chromedp.WaitVisible(css(`tr[data-run]`)),
	)
	gqlCall(t, base, owner, `mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, map[string]any{"id": key.CreateApiKey.ApiKey.ID}, nil)
	revoked := time.Now()
	var notice string
	run(t, ctx,
		chromedp.WaitVisible(css("#credential")),
		into(&notice, chromedp.Text(css(".notice"))),
		evalInto(&stored, `sessionStorage.getItem('composer.credential') || ''`),
	)
	t.Logf("signed out %.1f s after the revocation", time.Since(revoked).Seconds())
	assert.Contains(t, notice, "revoked")
	assert.Empty(t, stored)
	t.Logf("browser part: %.1f s", time.Since(began).Seconds())
}
