package dag

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ApprovalPolicy says who may answer an approval wait (wait.approvers):
// members with one of Roles, the members named by subject in Members, the
// API keys named by key id in APIKeys — anyone of those, or, when all
// three are empty, anyone who may write runs — and, with NotStarter, not
// the principal that started the run. The server enforces it on every
// signal of the wait's name (approve or signalRun alike) before anything
// is written.
//
// Members are named by subject, not email: an email is not unique in a
// tenant and whoever manages members sets it, so it could be given to
// someone else.
type ApprovalPolicy struct {
	Roles      []string `json:"roles,omitempty"`
	Members    []string `json:"members,omitempty"`
	APIKeys    []string `json:"api_keys,omitempty"`
	NotStarter bool     `json:"not_starter,omitempty"`
}

// MaxApprovers bounds the roles, members and keys one policy lists.
const MaxApprovers = 100

// Principal kinds: who answers a signal or starts a run, as the server
// authenticated it (never a value from a payload).
const (
	PrincipalUser     = "user"
	PrincipalAPIKey   = "api_key"
	PrincipalSchedule = "schedule"
)

// Principal is who sent a signal or started a run: a user (ID its
// subject, Role its role in the tenant when it acted), an API key (ID its
// key id) or a schedule (ID its id). The zero Principal is unknown.
type Principal struct {
	Kind string
	ID   string
	Role string
}

// String is the principal as the timeline and the database record it:
// "user:<subject>", "api_key:<key id>", "schedule:<id>" ("" when unknown).
func (p Principal) String() string {
	if p.Kind == "" {
		return ""
	}
	return p.Kind + ":" + p.ID
}

// ParsePrincipal reads what String wrote (the role is not recorded).
func ParsePrincipal(s string) Principal {
	kind, id, ok := strings.Cut(s, ":")
	if !ok || kind == "" {
		return Principal{}
	}
	return Principal{Kind: kind, ID: id}
}

// Same reports whether p and q are the same principal (the role aside).
func (p Principal) Same(q Principal) bool {
	return p.Kind != "" && p.Kind == q.Kind && p.ID == q.ID
}

// approverRoles are the roles that may answer approvals; a viewer may not
// write runs at all. (The names are auth's roles; dag imports nothing of
// the server.)
var approverRoles = []string{"owner", "admin", "developer"}

var apiKeyIDPattern = regexp.MustCompile(`^[0-9A-Za-z]{1,64}$`)

func (p *ApprovalPolicy) validate(ps *problems, label string) {
	if len(p.Roles)+len(p.Members)+len(p.APIKeys) > MaxApprovers {
		ps.add(label, "wait.approvers", "lists %d roles, members and keys; at most %d", len(p.Roles)+len(p.Members)+len(p.APIKeys), MaxApprovers)
		return
	}
	if len(p.Roles)+len(p.Members)+len(p.APIKeys) == 0 && !p.NotStarter {
		ps.add(label, "wait.approvers", "names nobody: give roles, members or api_keys, or not_starter")
	}
	seen := map[string]bool{}
	for _, r := range p.Roles {
		switch {
		case r == "viewer":
			ps.add(label, "wait.approvers.roles", "viewer: viewers may not write runs, so they cannot approve (give owner, admin or developer)")
		case !slices.Contains(approverRoles, r):
			ps.add(label, "wait.approvers.roles", "unknown role %q (owner, admin or developer)", r)
		case seen["role:"+r]:
			ps.add(label, "wait.approvers.roles", "%q is listed twice", r)
		}
		seen["role:"+r] = true
	}
	for _, m := range p.Members {
		switch {
		case m == "" || len(m) > 255 || !utf8.ValidString(m) || strings.IndexFunc(m, unprintable) >= 0:
			ps.add(label, "wait.approvers.members", "a member is named by subject: 1-255 printable characters")
		case seen["member:"+m]:
			ps.add(label, "wait.approvers.members", "%q is listed twice", m)
		}
		seen["member:"+m] = true
	}
	for _, k := range p.APIKeys {
		switch {
		case !apiKeyIDPattern.MatchString(k):
			ps.add(label, "wait.approvers.api_keys", "%q is not a key id (the 12 letters and digits after cmp_ in the key)", k)
		case seen["key:"+k]:
			ps.add(label, "wait.approvers.api_keys", "%q is listed twice", k)
		}
		seen["key:"+k] = true
	}
}

// unprintable are characters a name shown to people must not hold:
// controls and the invisible formatting characters (Unicode's Cf).
func unprintable(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

// Who says in words who may answer under the policy.
func (p *ApprovalPolicy) Who() string {
	if p == nil {
		return "anyone who may write runs"
	}
	var who []string
	if len(p.Roles) > 0 {
		who = append(who, "members with the "+strings.Join(p.Roles, " or ")+" role")
	}
	if len(p.Members) > 0 {
		who = append(who, plural(len(p.Members), "the member ", "the members ")+quoteAll(p.Members))
	}
	if len(p.APIKeys) > 0 {
		who = append(who, plural(len(p.APIKeys), "the API key ", "the API keys ")+quoteAll(p.APIKeys))
	}
	s := strings.Join(who, ", or ")
	if s == "" {
		s = "anyone who may write runs"
	}
	if p.NotStarter {
		s += ", except whoever started the run"
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func quoteAll(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
}

// Refusal says why by may not answer under the policy in a run started by
// starter, naming who may; "" when it may. A nil policy allows everyone
// (who may write runs); an unknown principal is allowed by no policy.
func (p *ApprovalPolicy) Refusal(by, starter Principal) string {
	if p == nil {
		return ""
	}
	if by.Kind == "" {
		return "the approver is unknown; it may be answered by " + p.Who()
	}
	if p.NotStarter && by.Same(starter) {
		return fmt.Sprintf("you (%s) started this run, so you may not approve it; it may be answered by %s", by, p.Who())
	}
	if len(p.Roles)+len(p.Members)+len(p.APIKeys) == 0 {
		return ""
	}
	switch by.Kind {
	case PrincipalUser:
		if slices.Contains(p.Roles, by.Role) || slices.Contains(p.Members, by.ID) {
			return ""
		}
	case PrincipalAPIKey:
		if slices.Contains(p.APIKeys, by.ID) {
			return ""
		}
	}
	return fmt.Sprintf("it may be answered by %s; you are %s", p.Who(), describe(by))
}

func describe(by Principal) string {
	switch by.Kind {
	case PrincipalUser:
		if by.Role != "" {
			return fmt.Sprintf("the member %q (%s)", by.ID, by.Role)
		}
		return fmt.Sprintf("the member %q", by.ID)
	case PrincipalAPIKey:
		return fmt.Sprintf("the API key %q", by.ID)
	}
	return by.String()
}

// ApprovalRefusal says why by may not send signal name to a run of w
// started by starter: name is the signal of an approval wait whose policy
// does not allow by (every approval wait of that name must allow it, since
// any of them may take the signal). "" when it may.
func (w *Workflow) ApprovalRefusal(name string, by, starter Principal) string {
	for _, id := range w.order {
		n := w.byID[id]
		if n.Type != TypeWait || n.Wait == nil || !n.Wait.Approval || n.Wait.Signal != name {
			continue
		}
		if why := n.Wait.Approvers.Refusal(by, starter); why != "" {
			return fmt.Sprintf("approval %q of node %s: %s", name, id, why)
		}
	}
	return ""
}

// Approvals lists the workflow's approval wait nodes in topological order.
func (w *Workflow) Approvals() []*Node {
	var out []*Node
	for _, id := range w.order {
		if n := w.byID[id]; n.Type == TypeWait && n.Wait != nil && n.Wait.Approval {
			out = append(out, n)
		}
	}
	return out
}
