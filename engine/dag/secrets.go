package dag

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// What a step that reads a secret produced is derived from the secret: a
// receiver may echo the credential back in any form (hex, reversed,
// base64), which no redaction of the exact value catches. The engine
// therefore marks, from the definition alone, which values may hold it:
// the input, output and error of a step that reads a secret and of every
// step downstream of one (expressions read only upstream nodes, so
// nothing else can see those values), and the run's output and error when
// any step reads one. The API shows them only to principals allowed to
// read what secrets produce (auth's secrets:outputs).

// ReadsSecrets reports whether the node's templates — or, for a map, its
// step's — read a secret.
func (n *Node) ReadsSecrets() bool {
	if len(n.SecretNames()) > 0 {
		return true
	}
	return n.Map != nil && n.Map.Step != nil && len(n.Map.Step.SecretNames()) > 0
}

// markSecretDerived computes secretDerived in topological order: a node
// is derived when it reads a secret or one of its dependencies is derived.
func (w *Workflow) markSecretDerived() {
	w.secretDerived = map[string]bool{}
	for _, id := range w.order {
		n := w.byID[id]
		derived := n.ReadsSecrets()
		for _, d := range n.DependsOn {
			derived = derived || w.secretDerived[d]
		}
		if derived {
			w.secretDerived[id] = true
		}
	}
}

// SecretDerived reports whether the values of a task of node id (a node
// or a map element "m[3]") — its input, output and error — may hold what a
// step that reads a secret produced.
func (w *Workflow) SecretDerived(id string) bool {
	if w.secretDerived[id] {
		return true
	}
	if base, _, ok := ParseItemID(id); ok {
		return w.secretDerived[base]
	}
	return false
}

// ReadsSecrets reports whether any step reads a secret: the run's output
// and error then count as derived from one (an output mapping, or the
// sinks' outputs, may hold it).
func (w *Workflow) ReadsSecrets() bool { return len(w.secretDerived) > 0 }

// CredentialName reports whether a header or query parameter of that name
// carries a credential: Authorization, Proxy-Authorization and Cookie,
// and any name that (ignoring case, '-', '_' and '.') contains api key,
// access key, private key, subscription key, token, secret, passw,
// credential, session, auth or signature — or is key, sig or pwd (the
// query parameters some APIs take keys in).
func CredentialName(name string) bool {
	n := strings.NewReplacer("-", "", "_", "", ".", "").Replace(strings.ToLower(name))
	switch n {
	case "authorization", "proxyauthorization", "cookie", "key", "sig", "pwd":
		return true
	}
	for _, part := range []string{"apikey", "accesskey", "privatekey", "subscriptionkey", "token", "secret", "passw",
		"credential", "session", "auth", "signature"} {
		if strings.Contains(n, part) {
			return true
		}
	}
	return false
}

// hole stands for what a segment reads from the run or a secret in a
// template's shape; constant segments are literal text.
const hole = "\x00"

// shape is the template's text with each segment that reads the run or a
// secret replaced by hole (and each constant one by "c").
func (t *template) shape() string {
	var b strings.Builder
	for _, s := range t.segments {
		switch {
		case s.prog != nil && s.constant:
			b.WriteString("c")
		case s.prog != nil || s.secret != "":
			b.WriteString(hole)
		default:
			b.WriteString(s.text)
		}
	}
	return b.String()
}

// literalValue reports whether a value of that shape is written into the
// definition whole: something other than blanks, taking nothing from the
// run or a secret.
func literalValue(shape string) bool {
	return strings.TrimSpace(shape) != "" && !strings.Contains(shape, hole)
}

// literalCredentials reports every credential header or query parameter
// an http step (or a map's http step) writes into the definition
// literally: a version is stored as it is, so the credential would sit in
// plain text in the database.
func (w *Workflow) literalCredentials() []Problem {
	var ps problems
	for _, n := range w.Nodes {
		h := n.HTTP
		if n.Map != nil && n.Map.Step != nil {
			h = n.Map.Step.HTTP
		}
		if h == nil || h.templates == nil {
			continue
		}
		ht := h.templates
		advice := func(field, name string) {
			ps.add(n.ID, ht.prefix+field+"."+name, "%s carries a credential written into the definition, which is stored as it is: "+
				"keep it in a secret (createSecret) and write {{ secrets.NAME }} instead, e.g. \"Bearer {{ secrets.API_TOKEN }}\"", name)
		}
		for _, k := range slices.Sorted(maps.Keys(ht.headers)) {
			if t := ht.headers[k]; t != nil && CredentialName(k) && literalValue(t.shape()) {
				advice("headers", k)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(ht.query)) {
			if t := ht.query[k]; t != nil && CredentialName(k) && literalValue(t.shape()) {
				advice("query", k)
			}
		}
		if ht.url != nil {
			for _, name := range literalURLCredentials(ht.url.shape()) {
				ps.add(n.ID, ht.prefix+"url", "its query parameter %s carries a credential written into the definition, which is stored as it is: "+
					"give it in http.query as {{ secrets.NAME }} instead", name)
			}
		}
	}
	return ps
}

// literalURLCredentials lists the credential parameters of a url shape's
// query whose values are literal.
func literalURLCredentials(shape string) []string {
	_, query, ok := strings.Cut(shape, "?")
	if !ok {
		return nil
	}
	query, _, _ = strings.Cut(query, "#")
	var out []string
	for _, pair := range strings.Split(query, "&") {
		name, value, _ := strings.Cut(pair, "=")
		if CredentialName(name) && literalValue(value) {
			out = append(out, name)
		}
	}
	return out
}

// ParseForPublish is Parse for a definition about to become a new
// version: it also refuses what stored versions may hold but new ones may
// not — credentials written literally into http steps (a version is
// stored as it is; the credential belongs in a secret). Stored versions
// are read with Parse, so runs of a version published before keep working.
func ParseForPublish(data []byte) (*Workflow, error) {
	w, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if ps := w.literalCredentials(); len(ps) > 0 {
		return nil, &ValidationError{ps}
	}
	return w, nil
}

// LiteralCredentials lists the credentials a parsed (stored) definition
// writes literally, for operators finding the versions published before
// ParseForPublish refused them.
func (w *Workflow) LiteralCredentials() []string {
	ps := w.literalCredentials()
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = fmt.Sprintf("%s %s", p.Node, p.Field)
	}
	return out
}
