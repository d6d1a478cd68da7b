package e2e

import (
	"encoding/json"
	"fmt"
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

// fitsWidth lists what makes the page wider than the window (nothing when
// the page needs no horizontal scrolling): the document's overflow, and
// the elements of the header and main whose right edge lies beyond the
// window outside a scrolling box of their own.
const fitsWidth = `(() => {
  const w = document.documentElement.clientWidth, out = [];
  if (document.documentElement.scrollWidth > w) out.push('document ' + document.documentElement.scrollWidth + ' > ' + w);
  for (const el of document.querySelectorAll('header *, main *')) {
    if (el.offsetParent === null || el.closest('svg')) continue;
    let scrolled = false;
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === 'auto' || o === 'scroll' || o === 'hidden') { scrolled = true; break; }
    }
    if (!scrolled && el.getBoundingClientRect().right > w + 1) out.push(el.tagName + '.' + el.className + ' ' + Math.round(el.getBoundingClientRect().right));
  }
  return out.slice(0, 10);
})()`

// TestConsoleRunActionsAndAdminOnALaptop drives the rest of the console
// in headless Chromium at a laptop's 1280 × 800: a signal sent from a
// waiting run, an approval rejected, a run re-run as new, the runs list
// filtered by workflow and time, a version published, members added,
// re-roled and removed, an error shown with its code in words, a webhook
// delivery redelivered and the signing secret rotated, the invoice
// preview against the API's — every page without horizontal scrolling —
// the stats page's range and workflow, a webhook endpoint disabled,
// enabled and deleted, a dialog dismissed with Escape, and an expiring
// token signed out.
func TestConsoleRunActionsAndAdminOnALaptop(t *testing.T) {
	env := testenv.New(t)
	base, _ := startDev(t, env)
	session := devSession(t, base)
	owner := session.Token
	ctx := browser(t, 1280, 800)
	// fits checks the page needs no horizontal scrolling, its text has a
	// contrast of at least 4.5:1 and each of its controls a label.
	fits := func(page string) {
		t.Helper()
		var over, low, unlabelled []string
		run(t, ctx, evalInto(&over, fitsWidth), evalInto(&low, lowContrast), evalInto(&unlabelled, unlabelledControls))
		assert.Empty(t, over, "%s is wider than a 1280 px window", page)
		assert.Empty(t, low, "text below 4.5:1 on %s", page)
		assert.Empty(t, unlabelled, "controls without a label on %s", page)
	}

	var endpoint struct {
		CreateWebhookEndpoint struct{ Endpoint struct{ ID string } }
	}
	gqlCall(t, base, owner, `mutation($u: String!) { createWebhookEndpoint(input: {url: $u, eventTypes: ["run.completed", "run.failed"]}) { endpoint { id } } }`,
		map[string]any{"u": base + "/v1/dev/echo"}, &endpoint)
	epID := endpoint.CreateWebhookEndpoint.Endpoint.ID
	var wf struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	gqlCall(t, base, owner, `mutation($d: JSON!) { createWorkflow(input: {name: "gate", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": map[string]any{"nodes": []any{
			map[string]any{"id": "hold", "type": "wait", "wait": map[string]any{"signal": "go", "timeout": "1h"}},
			map[string]any{"id": "after", "type": "noop", "depends_on": []string{"hold"}},
		}}}, &wf)
	gate := wf.CreateWorkflow.Workflow.ID
	gqlCall(t, base, owner, `mutation($d: JSON!) { createWorkflow(input: {name: "orders", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(approvalDef)}, &wf)
	orders := wf.CreateWorkflow.Workflow.ID
	start := func(workflow string) string {
		var started struct {
			StartRun struct{ Run struct{ ID string } }
		}
		gqlCall(t, base, owner, `mutation($w: ID!) { startRun(input: {workflowId: $w, input: {order: "o-9"}}) { run { id } } }`, map[string]any{"w": workflow}, &started)
		return started.StartRun.Run.ID
	}

	run(t, ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(css("#demo-signin")),
		chromedp.Click(css("#demo-signin")),
		chromedp.WaitVisible(css("#start-run")),
	)
	fits("the runs list")

	// A signal, sent from the run's "why it waits": its payload is the
	// waiting node's output and the run completes.
	signalled := start(gate)
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/runs/%s')`, signalled)),
		poll(`(document.querySelector('#waiting') || {textContent: ''}).textContent.includes('waits for the signal “go”')`),
		chromedp.Click(css(`#waiting button[data-signal="hold"]`)),
		chromedp.WaitVisible(css("#f-payload")),
		poll(`document.querySelector('#f-name').value === 'go'`),
		chromedp.SetValue(css("#f-payload"), `{"approvedBy": "ops-7"}`),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`document.querySelector('h1 .badge').textContent === 'completed'`),
		poll(`[...document.querySelectorAll('#graph .node')].every(n => n.dataset.state === 'completed')`),
		chromedp.Click(css(`#graph .node[data-node="hold"]`)),
		poll(`document.querySelector('#node-detail').textContent.includes('ops-7')`),
	)
	fits("a run's page")

	// An approval rejected with a comment fails the run; re-run as new, it
	// is a new run that names the old one and waits for approval again.
	rejected := start(orders)
	var rerunURL string
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/runs/%s')`, rejected)),
		chromedp.WaitVisible(css(`#waiting button[data-reject="approve"]`)),
		chromedp.Click(css(`#waiting button[data-reject="approve"]`)),
		chromedp.WaitVisible(css("#f-comment")),
		chromedp.SetValue(css("#f-comment"), "wrong address"),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`document.querySelector('h1 .badge').textContent === 'failed'`),
		poll(`document.querySelector('#graph .node[data-node="approve"]').dataset.state === 'failed'`),
		chromedp.Click(css(`#graph .node[data-node="approve"]`)),
		poll(`document.querySelector('#node-detail').textContent.includes('wrong address')`),
		chromedp.Click(css("#act-rerun-new")),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(fmt.Sprintf(`location.pathname !== '/runs/%s' && !!document.querySelector('a[href="/runs/%s"]')`, rejected, rejected)),
		chromedp.WaitVisible(css(`#waiting button[data-approve="approve"]`)),
		into(&rerunURL, chromedp.Location()),
	)
	again := strings.TrimPrefix(rerunURL, base+"/runs/")
	var rerun struct {
		Run struct {
			RerunOf string
			Status  string
			Input   map[string]any
		}
	}
	gqlCall(t, base, owner, `query($id: ID!) { run(id: $id) { rerunOf status input } }`, map[string]any{"id": again}, &rerun)
	assert.Equal(t, rejected, rerun.Run.RerunOf)
	assert.Equal(t, "RUNNING", rerun.Run.Status)
	assert.Equal(t, map[string]any{"order": "o-9"}, rerun.Run.Input, "re-run as new keeps the input")

	// The runs list filtered by workflow (with its counts) and by creation
	// time, the filters in the address.
	local := func(offset string) string {
		return fmt.Sprintf(`(() => { const d = new Date(Date.now() %s); return new Date(d - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16); })()`, offset)
	}
	run(t, ctx,
		js(`composer.navigate('/runs')`),
		chromedp.WaitVisible(css("#flt-workflow")),
		chromedp.SetValue(css("#flt-workflow"), gate),
		chromedp.Click(css(`form.filters button[type="submit"]`)),
		poll(fmt.Sprintf(`location.search === '?workflow=%s' && document.querySelectorAll('tr[data-run]').length === 1 && !!document.querySelector('tr[data-run="%s"]')`, gate, signalled)),
		poll(`parseInt((document.querySelector('.counts .count[data-status="COMPLETED"] .n') || {}).textContent, 10) === 1 &&
			parseInt((document.querySelector('.counts .count[data-status="FAILED"] .n') || {}).textContent, 10) === 0`),
	)
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/runs?after=' + %s + '&before=' + %s)`, local("- 600e3"), local("+ 600e3"))),
		poll(`document.querySelectorAll('tr[data-run]').length === 3`),
		js(fmt.Sprintf(`composer.navigate('/runs?after=' + %s)`, local("+ 600e3"))),
		poll(`document.querySelector('main').textContent.includes('No runs match these filters.') && document.querySelectorAll('tr[data-run]').length === 0`),
	)

	// A new version published from the console: the editor starts from the
	// current definition, the preview is drawn as it is edited (a cycle is
	// named before publishing), the server's problem is shown on its node,
	// and the published version opens as a diff against the one before.
	setDef := func(def string) chromedp.Action[chromedp.Void] {
		return js(fmt.Sprintf(`(() => { const a = document.querySelector('#wf-def'); a.value = %q; a.dispatchEvent(new Event('input')); })()`, def))
	}
	run(t, ctx,
		js(fmt.Sprintf(`composer.navigate('/workflows/%s')`, gate)),
		chromedp.WaitVisible(css("#publish")),
		chromedp.Click(css("#publish")),
		chromedp.WaitVisible(css("#wf-def")),
		poll(`document.querySelector('#wf-def').value.includes('"hold"') && document.querySelectorAll('#preview .node').length === 2`),
	)
	run(t, ctx,
		setDef(`{"nodes": [{"id": "hold", "type": "wait", "wait": {"signal": "go"}, "depends_on": ["after"]}, {"id": "after", "type": "noop", "depends_on": ["hold"]}]}`),
		poll(`document.querySelector('#editor-status').textContent.includes('A cycle through')`),
		chromedp.Click(css("#wf-submit")),
		chromedp.WaitVisible(css(`#editor-status .error`)),
		poll(`document.querySelectorAll('#preview .node.problem').length > 0`),
	)
	run(t, ctx,
		setDef(`{"nodes": [{"id": "hold", "type": "wait", "wait": {"signal": "go", "timeout": "2h"}},
			{"id": "after", "type": "noop", "depends_on": ["hold"]}, {"id": "audit", "type": "noop", "depends_on": ["after"]}]}`),
		poll(`!!document.querySelector('#preview .node[data-node="audit"]') && !document.querySelector('#preview .node.problem')`),
		chromedp.Click(css("#wf-submit")),
	)
	run(t, ctx, poll(`location.search === '?a=1&b=2' && (document.querySelector('#diff-summary') || {textContent: ''}).textContent.includes('between v1 and v2')`))
	var versions struct {
		Workflow struct{ Versions []struct{ Version int } }
	}
	gqlCall(t, base, owner, `query($id: ID!) { workflow(id: $id) { versions { version } } }`, map[string]any{"id": gate}, &versions)
	assert.Len(t, versions.Workflow.Versions, 2, "one version published from the console, none by the refused attempt")

	// Members: added, given another role, removed; the last owner's removal
	// is refused with its code in words.
	type member struct{ Subject, Role string }
	members := func() map[string]string {
		var m struct{ Members []member }
		gqlCall(t, base, owner, `{ members { subject role } }`, nil, &m)
		out := map[string]string{}
		for _, x := range m.Members {
			out[x.Subject] = x.Role
		}
		return out
	}
	before := members()
	owners := 0
	for _, r := range before {
		if r == "OWNER" {
			owners++
		}
	}
	require.Equal(t, 1, owners, "the demo tenant has one owner: %v", before)
	const dev = "dev@example.com"
	run(t, ctx,
		js(`composer.navigate('/admin/members')`),
		chromedp.WaitVisible(css("#add-member")),
		chromedp.Click(css("#add-member")),
		chromedp.WaitVisible(css("#f-subject")),
		chromedp.SetValue(css("#f-subject"), dev),
		chromedp.SetValue(css("#f-email"), dev),
		chromedp.SetValue(css("#f-role"), "DEVELOPER"),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(fmt.Sprintf(`(document.querySelector('select[aria-label="Role of %s"]') || {}).value === 'DEVELOPER'`, dev)),
	)
	assert.Equal(t, "DEVELOPER", members()[dev])
	fits("the members tab")
	screenshot(t, ctx, "members")
	run(t, ctx,
		js(fmt.Sprintf(`(() => { const s = document.querySelector('select[aria-label="Role of %s"]'); s.value = 'VIEWER'; s.dispatchEvent(new Event('change')); })()`, dev)),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`[...document.querySelectorAll('#toasts .toast')].some(t => t.textContent === 'Role changed.')`),
	)
	assert.Equal(t, "VIEWER", members()[dev])
	run(t, ctx,
		clickInRow("tr", fmt.Sprintf(`tr.textContent.startsWith(%q) && tr.querySelector('select').value === 'VIEWER'`, dev), "button"),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(fmt.Sprintf(`!document.querySelector('select[aria-label="Role of %s"]')`, dev)),
	)
	assert.NotContains(t, members(), dev)
	var refused string
	run(t, ctx,
		clickInRow("tr", fmt.Sprintf(`!document.querySelector('select[aria-label="Role of %s"]') && tr.querySelector('.tag') && tr.querySelector('.tag').textContent === 'you'`, dev), "button"),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`[...document.querySelectorAll('#toasts .toast.err')].some(t => t.textContent.includes('(CONFLICT)'))`),
		evalInto(&refused, `[...document.querySelectorAll('#toasts .toast.err')].map(t => t.textContent).join(' | ')`),
	)
	assert.Contains(t, refused, "Conflicts with the current state (CONFLICT)")
	assert.Equal(t, before, members(), "the refused removal changed nothing")
	// Escape dismisses a dialog, and nothing is done.
	run(t, ctx,
		chromedp.Click(css("#add-member")),
		chromedp.WaitVisible(css("#f-subject")),
		chromedp.SetValue(css("#f-subject"), "escaped@example.com"),
		chromedp.KeyEvent("\u001b"),
		poll(`!document.querySelector('dialog[open]')`),
	)
	assert.Equal(t, before, members(), "a dismissed dialog adds no one")

	// Webhooks: the completed run's delivery succeeded; redelivered from
	// the console it has a second attempt, with the same webhook id.
	type delivery struct {
		ID, EventType, State, WebhookID string
		Attempts                        []struct{ StatusCode *int }
	}
	deliveries := func() []delivery {
		var d struct {
			WebhookDeliveries struct{ Edges []struct{ Node delivery } }
		}
		gqlCall(t, base, owner, `query($e: ID) { webhookDeliveries(endpointId: $e) { edges { node { id eventType state webhookId attempts { statusCode } } } } }`,
			map[string]any{"e": epID}, &d)
		var out []delivery
		for _, e := range d.WebhookDeliveries.Edges {
			out = append(out, e.Node)
		}
		return out
	}
	var done delivery
	require.Eventually(t, func() bool {
		for _, d := range deliveries() {
			if d.EventType == "run.completed" && d.State == "SUCCEEDED" {
				done = d
				return true
			}
		}
		return false
	}, 20*time.Second, 100*time.Millisecond, "the completed run's webhook is delivered")
	run(t, ctx,
		js(`composer.navigate('/admin/webhooks')`),
		chromedp.WaitVisible(css(".endpoint")),
		poll(`[...document.querySelectorAll('#deliveries tr')].some(tr => tr.textContent.includes('run.completed') && tr.textContent.includes('succeeded') && tr.textContent.includes('HTTP 200'))`),
		clickInRow("#deliveries tr", `tr.textContent.includes('run.completed')`, "button"),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
	)
	require.Eventually(t, func() bool {
		for _, d := range deliveries() {
			if d.ID == done.ID {
				return len(d.Attempts) >= 2 && d.State == "SUCCEEDED" && d.WebhookID == done.WebhookID
			}
		}
		return false
	}, 20*time.Second, 100*time.Millisecond, "the redelivery is a second attempt of the same delivery")
	run(t, ctx,
		chromedp.Click(css(`.endpoint .actions button:nth-child(1)`)),
		poll(`[...document.querySelectorAll('#deliveries tr')].some(tr => tr.textContent.includes('run.completed') && tr.textContent.includes('#2'))`),
	)
	fits("the webhooks tab")
	// The signing secret rotated with an hour's grace: the new one is shown
	// once, the old one is listed as rotated out.
	var secret string
	run(t, ctx,
		chromedp.Click(css(`.endpoint .actions button:nth-child(3)`)),
		chromedp.WaitVisible(css("#f-grace")),
		chromedp.SetValue(css("#f-grace"), "1"),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		chromedp.WaitVisible(css("dialog code.secret")),
		into(&secret, chromedp.Text(css("dialog code.secret"))),
		chromedp.Click(css("dialog .btn.primary")),
		poll(`[...document.querySelectorAll('.endpoint .tag')].some(t => t.textContent.startsWith('rotated out'))`),
	)
	assert.NotEmpty(t, secret)
	var eps struct {
		WebhookEndpoints []struct {
			ID      string
			Secrets []struct{ ExpiresAt *time.Time }
		}
	}
	gqlCall(t, base, owner, `{ webhookEndpoints { id secrets { expiresAt } } }`, nil, &eps)
	require.Len(t, eps.WebhookEndpoints, 1)
	var grace []time.Duration
	for _, s := range eps.WebhookEndpoints[0].Secrets {
		if s.ExpiresAt != nil {
			grace = append(grace, time.Until(*s.ExpiresAt))
		}
	}
	require.Len(t, eps.WebhookEndpoints[0].Secrets, 2, "the current secret and the rotated-out one")
	require.Len(t, grace, 1)
	assert.InDelta(t, time.Hour.Seconds(), grace[0].Seconds(), 120, "an hour's grace, as asked in the console")
	// Disabled (confirmed), enabled again, then deleted (confirmed).
	button := func(label string) chromedp.Action[chromedp.Void] {
		return poll(fmt.Sprintf(`(() => { const b = [...document.querySelectorAll('.endpoint .actions button')].find(b => b.textContent === %q);
			if (!b) return false; b.click(); return true; })()`, label))
	}
	enabled := func() []bool {
		var e struct{ WebhookEndpoints []struct{ Enabled bool } }
		gqlCall(t, base, owner, `{ webhookEndpoints { enabled } }`, nil, &e)
		var out []bool
		for _, x := range e.WebhookEndpoints {
			out = append(out, x.Enabled)
		}
		return out
	}
	run(t, ctx,
		button("Disable"),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`(document.querySelector('.endpoint .badge') || {}).textContent === 'disabled'`),
	)
	assert.Equal(t, []bool{false}, enabled())
	run(t, ctx, button("Enable"), poll(`(document.querySelector('.endpoint .badge') || {}).textContent === 'enabled'`))
	assert.Equal(t, []bool{true}, enabled())
	run(t, ctx,
		button("Delete"),
		chromedp.WaitVisible(css(`dialog button[value="ok"]`)),
		chromedp.Click(css(`dialog button[value="ok"]`)),
		poll(`!document.querySelector('.endpoint') && document.querySelector('main').textContent.includes('No endpoints.')`),
	)
	assert.Empty(t, enabled())

	// Usage: the invoice preview's rows are the API's line items, its total
	// the API's total.
	var inv struct {
		InvoicePreview struct {
			Currency   string
			TotalCents int64
			LineItems  []struct{ Meter string }
		}
	}
	gqlCall(t, base, owner, `{ invoicePreview { currency totalCents lineItems { meter } } }`, nil, &inv)
	var meters []string
	for _, li := range inv.InvoicePreview.LineItems {
		meters = append(meters, li.Meter)
	}
	require.NotEmpty(t, meters)
	var shown []string
	var total, want string
	run(t, ctx,
		js(`composer.navigate('/admin/usage')`),
		chromedp.WaitVisible(css(`table tr.total`)),
		evalInto(&shown, `[...[...document.querySelectorAll('table')].find(t => t.caption && t.caption.textContent === 'Invoice preview')
			.querySelectorAll('tbody tr:not(.total) td.mono')].map(td => td.textContent)`),
		evalInto(&total, `document.querySelector('table tr.total td:nth-child(6)').textContent`),
		evalInto(&want, fmt.Sprintf(`(%d / 100).toLocaleString(undefined, {style: 'currency', currency: %q})`, inv.InvoicePreview.TotalCents, inv.InvoicePreview.Currency)),
	)
	assert.Equal(t, meters, shown)
	var price string
	run(t, ctx, evalInto(&price, `[...document.querySelectorAll('table tr')].find(tr => tr.textContent.startsWith('runs_started')).querySelector('td:nth-child(5)').textContent`))
	assert.Equal(t, "$0.0002", price, "the pro plan's 200 micro-dollars a run, not rounded to cents")
	assert.Equal(t, want, total)
	fits("the usage tab")
	screenshot(t, ctx, "usage")

	// Stats: the range and the workflow chosen are in the address, and the
	// bars are the chosen workflow's (one run of "gate" started).
	const startedBars = `[...document.querySelectorAll('#stats svg.chart rect.bar.started title')].map(t => parseInt(t.textContent.split(': ')[1], 10)).reduce((a, b) => a + b, 0)`
	run(t, ctx,
		js(`composer.navigate('/stats')`),
		chromedp.WaitVisible(css("#stats svg.chart")),
		js(`(() => { const s = document.querySelector('#st-range'); s.value = '7d'; s.dispatchEvent(new Event('change')); })()`),
		poll(`location.search === '?range=7d' && /^[78] buckets/.test((document.querySelector('#chart-desc') || {textContent: ''}).textContent)`),
		js(fmt.Sprintf(`(() => { const s = document.querySelector('#st-workflow'); s.value = %q; s.dispatchEvent(new Event('change')); })()`, gate)),
		poll(fmt.Sprintf(`location.search === '?range=7d&workflow=%s' && !!document.querySelector('#stats svg.chart') && %s === 1`, gate, startedBars)),
	)

	for _, page := range []struct{ path, ready string }{
		{"/workflows", "#new-workflow"}, {"/workflows/" + orders, "#diff"}, {"/stats", "#stats svg.chart"}, {"/admin/keys", "#create-key"},
	} {
		run(t, ctx, js(fmt.Sprintf(`composer.navigate(%q)`, page.path)), chromedp.WaitVisible(css(page.ready)))
		fits(page.path)
	}

	// A token that expires signs the console out, with nothing left in the
	// session's storage.
	var who struct{ Viewer struct{ Subject string } }
	gqlCall(t, base, owner, `{ viewer { subject } }`, nil, &who)
	short, err := auth.MintDevToken(app.DevJWTSecret, "composer", "composer-api", session.TenantID, who.Viewer.Subject, string(auth.RoleOwner), 3*time.Second)
	require.NoError(t, err)
	var notice, stored string
	run(t, ctx,
		chromedp.Click(css("#signout")),
		chromedp.WaitVisible(css("#credential")),
		chromedp.SetValue(css("#credential"), short),
		chromedp.Click(css("#signin-submit")),
		chromedp.WaitVisible(css("#start-run")),
		chromedp.WaitVisible(css("#credential")),
		into(&notice, chromedp.Text(css(".notice"))),
		evalInto(&stored, `sessionStorage.getItem('composer.credential') || ''`),
	)
	assert.Contains(t, notice, "expired")
	assert.Empty(t, stored)
}
