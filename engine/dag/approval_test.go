package dag

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func approvalDef(approvers string) string {
	return `{"nodes": [{"id": "review", "type": "wait", "wait": {"signal": "approval", "approval": true, "approvers": ` + approvers + `}}]}`
}

func TestApprovalPolicyProblems(t *testing.T) {
	for def, want := range map[string]string{
		approvalDef(`{"roles": ["admin"], "members": ["auth0|ann"], "api_keys": ["Ab12Cd34Ef56"], "not_starter": true}`): "",
		approvalDef(`{"not_starter": true}`):         "",
		approvalDef(`{}`):                            `node "review": wait.approvers: names nobody: give roles, members or api_keys, or not_starter`,
		approvalDef(`{"roles": ["viewer"]}`):         `wait.approvers.roles: viewer: viewers may not write runs, so they cannot approve`,
		approvalDef(`{"roles": ["boss"]}`):           `wait.approvers.roles: unknown role "boss" (owner, admin or developer)`,
		approvalDef(`{"roles": ["admin", "admin"]}`): `wait.approvers.roles: "admin" is listed twice`,
		approvalDef(`{"members": [""]}`):             `wait.approvers.members: a member is named by subject`,
		approvalDef(`{"members": ["a\u202eb"]}`):     `wait.approvers.members: a member is named by subject`,
		approvalDef(`{"api_keys": ["cmp_x"]}`):       `wait.approvers.api_keys: "cmp_x" is not a key id`,
		approvalDef(`{"roles": "admin"}`):            `wait.approvers.roles`,
		approvalDef(`{"who": ["admin"]}`):            `unknown field "who"`,
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"signal": "go", "approvers": {"roles": ["admin"]}}}]}`: `node "w": wait.approvers: is for approval waits (set wait.approval)`,
	} {
		_, err := Parse([]byte(def))
		if want == "" {
			assert.NoError(t, err, def)
			continue
		}
		if assert.Error(t, err, def) {
			assert.Contains(t, err.Error(), want, def)
		}
	}
	many := `{"members": [`
	for i := range MaxApprovers + 1 {
		if i > 0 {
			many += ","
		}
		many += `"m` + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `"`
	}
	_, err := Parse([]byte(approvalDef(many + `]}`)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "at most 100")
}

func TestApprovalPolicyAllowsOnlyWhomItNames(t *testing.T) {
	admin := Principal{Kind: PrincipalUser, ID: "ann", Role: "admin"}
	dev := Principal{Kind: PrincipalUser, ID: "dan", Role: "developer"}
	named := Principal{Kind: PrincipalUser, ID: "auth0|bob", Role: "developer"}
	key := Principal{Kind: PrincipalAPIKey, ID: "Ab12Cd34Ef56"}
	otherKey := Principal{Kind: PrincipalAPIKey, ID: "Zz12Cd34Ef56"}
	wf := MustParse(approvalDef(`{"roles": ["admin", "owner"], "members": ["auth0|bob"], "api_keys": ["Ab12Cd34Ef56"], "not_starter": true}`))
	for _, c := range []struct {
		by, starter Principal
		refused     string
	}{
		{admin, dev, ""},
		{named, dev, ""},
		{key, dev, ""},
		{dev, admin, `it may be answered by members with the admin or owner role, or the member "auth0|bob", or the API key "Ab12Cd34Ef56", except whoever started the run; you are the member "dan" (developer)`},
		{otherKey, admin, `you are the API key "Zz12Cd34Ef56"`},
		{admin, admin, `you (user:ann) started this run, so you may not approve it`},
		{key, key, `you (api_key:Ab12Cd34Ef56) started this run`},
		{Principal{}, dev, "the approver is unknown"},
		// A key named like a member, or a user whose subject is a listed key id, is not it.
		{Principal{Kind: PrincipalAPIKey, ID: "auth0|bob"}, dev, "you are the API key"},
		{Principal{Kind: PrincipalUser, ID: "Ab12Cd34Ef56", Role: "developer"}, dev, "you are the member"},
	} {
		got := wf.ApprovalRefusal("approval", c.by, c.starter)
		if c.refused == "" {
			assert.Empty(t, got, "%+v", c.by)
			continue
		}
		assert.Contains(t, got, `approval "approval" of node review: `, "%+v", c.by)
		assert.Contains(t, got, c.refused, "%+v", c.by)
	}
	assert.Empty(t, wf.ApprovalRefusal("other", dev, dev), "another signal name is no approval of this node")

	onlyNotStarter := MustParse(approvalDef(`{"not_starter": true}`))
	assert.Empty(t, onlyNotStarter.ApprovalRefusal("approval", dev, admin), "anyone but the starter")
	assert.Contains(t, onlyNotStarter.ApprovalRefusal("approval", dev, dev), "started this run")
	assert.Empty(t, onlyNotStarter.ApprovalRefusal("approval", dev, Principal{}), "an unknown starter is nobody")

	open := MustParse(`{"nodes": [{"id": "w", "type": "wait", "wait": {"signal": "approval", "approval": true}}]}`)
	assert.Empty(t, open.ApprovalRefusal("approval", Principal{}, Principal{}), "without a policy anyone who may write runs answers")
}

// TestEveryApprovalOfASignalMustAllowTheSender: two approval waits share a
// signal name; either may take the signal, so it must satisfy both.
func TestEveryApprovalOfASignalMustAllowTheSender(t *testing.T) {
	wf := MustParse(`{"nodes": [
		{"id": "a", "type": "wait", "wait": {"signal": "go", "approval": true, "approvers": {"roles": ["admin", "developer"]}}},
		{"id": "b", "type": "wait", "depends_on": ["a"], "wait": {"signal": "go", "approval": true, "approvers": {"roles": ["admin"]}}}]}`)
	assert.Empty(t, wf.ApprovalRefusal("go", Principal{Kind: PrincipalUser, ID: "x", Role: "admin"}, Principal{}))
	assert.Contains(t, wf.ApprovalRefusal("go", Principal{Kind: PrincipalUser, ID: "x", Role: "developer"}, Principal{}), "node b")
	require.Len(t, wf.Approvals(), 2)
	assert.Equal(t, "members with the admin role", wf.Approvals()[1].Wait.Approvers.Who())
}

func TestPrincipalsRoundTrip(t *testing.T) {
	for _, p := range []Principal{{Kind: PrincipalUser, ID: "google-oauth2|1:2"}, {Kind: PrincipalAPIKey, ID: "Ab12Cd34Ef56"}, {}} {
		assert.Equal(t, p, ParsePrincipal(p.String()))
	}
	assert.False(t, Principal{}.Same(Principal{}), "an unknown principal is nobody")
}
