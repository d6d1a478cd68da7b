package redisconn_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyArgs says which arguments of a command (after its name, 1-based) are
// keys. A script calling a command missing here fails
// TestEveryScriptDeclaresItsKeys: add it, with its key positions.
var keyArgs = map[string]func(args []string) []int{
	"TIME": none,
	// One key, first.
	"GET": first, "SET": first, "EXISTS": all, "DEL": all, "UNLINK": all, "PEXPIRE": first, "EXPIRE": first, "PTTL": first,
	"HSET": first, "HGET": first, "HDEL": first, "HINCRBY": first, "HMGET": first, "HGETALL": first,
	"ZADD": first, "ZREM": first, "ZSCORE": first, "ZCARD": first, "ZCOUNT": first, "ZRANGEBYSCORE": first,
	"ZREMRANGEBYSCORE": first, "SADD": first, "SREM": first, "SMEMBERS": first,
	"XADD": first, "XACK": first, "XDEL": first, "XLEN": first, "XAUTOCLAIM": first, "XCLAIM": first, "XPENDING": first,
	"XRANGE": first,
	// XGROUP <subcommand> <key> ...; XINFO GROUPS <key>
	"XGROUP": func([]string) []int { return []int{2} },
	"XINFO":  func([]string) []int { return []int{2} },
	// XREADGROUP ... STREAMS <key>... <id>...
	"XREADGROUP": func(args []string) []int {
		for i, a := range args {
			if strings.EqualFold(unquote(a), "STREAMS") {
				rest := len(args) - (i + 1)
				var out []int
				for k := 0; k < rest/2; k++ {
					out = append(out, i+2+k)
				}
				return out
			}
		}
		return nil
	},
}

func none([]string) []int  { return nil }
func first([]string) []int { return []int{1} }
func all(args []string) []int {
	out := make([]int, len(args))
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// TestEveryScriptDeclaresItsKeys reads every Lua script of the module
// (redis.NewScript with a literal) and checks that each key it touches is
// one of its KEYS — KEYS[n], or a local bound to one — never a name built
// inside the script: on a cluster a script runs on the node of its first
// key, and an undeclared key may live on another node, or silently on this
// one today and elsewhere after a resharding. That the declared keys share
// one slot is checked by running the scripts on a cluster
// (TestScriptsAndMultiKeyCommandsOnACluster, and make test-cluster).
func TestEveryScriptDeclaresItsKeys(t *testing.T) {
	root := moduleRoot(t)
	scripts := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return nil // (another package's work in progress)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "NewScript" {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: a script that is not a literal cannot be checked", fset.Position(call.Pos()))
				return true
			}
			src, _ := strconv.Unquote(lit.Value)
			scripts++
			rel, _ := filepath.Rel(root, path)
			for _, problem := range checkScript(src) {
				t.Errorf("%s:%d: %s", rel, fset.Position(call.Pos()).Line, problem)
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, scripts, 9, "the module's scripts were found")
}

func TestCheckScriptCatchesBuiltKeys(t *testing.T) {
	assert.Empty(t, checkScript(`local k = KEYS[2]
redis.call('HSET', KEYS[1], ARGV[1], 'x') redis.call("XGROUP", 'CREATE', k, ARGV[2], '0')
for _, key in ipairs(KEYS) do redis.call('XLEN', key) end
local x = redis.call('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', 1, 'STREAMS', k, '>')`))
	assert.NotEmpty(t, checkScript(`redis.call('GET', 'ns:' .. ARGV[1])`))
	assert.NotEmpty(t, checkScript(`redis.call('GET', ARGV[1])`))
	assert.NotEmpty(t, checkScript(`local k = ARGV[1] redis.call('DEL', KEYS[1], k)`))
	assert.NotEmpty(t, checkScript(`redis.call(ARGV[1], KEYS[1])`), "a command named at run time")
	assert.NotEmpty(t, checkScript(`redis.call('LPUSH', KEYS[1], 'x')`), "a command the table does not know")
	assert.NotEmpty(t, checkScript(`redis.call('XREADGROUP', 'GROUP', 'g', 'c', 'STREAMS', KEYS[1], ARGV[1], '>', '>')`))
}

var (
	callRe  = regexp.MustCompile(`redis\.p?call\s*\(`)
	localRe = regexp.MustCompile(`local\s+([A-Za-z_][A-Za-z0-9_]*)\s*=\s*KEYS\[[^\]]+\]`)
	loopRe  = regexp.MustCompile(`for\s+[A-Za-z_][A-Za-z0-9_]*\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s+in\s+i?pairs\(\s*KEYS\s*\)`)
	keysRe  = regexp.MustCompile(`^KEYS\[[^\]]+\]$`)
)

// checkScript lists the key arguments of a script's calls that are not
// declared keys.
func checkScript(src string) []string {
	fromKeys := map[string]bool{}
	for _, m := range localRe.FindAllStringSubmatch(src, -1) {
		fromKeys[m[1]] = true
	}
	for _, m := range loopRe.FindAllStringSubmatch(src, -1) {
		fromKeys[m[1]] = true // for _, key in ipairs(KEYS)
	}
	var problems []string
	for _, loc := range callRe.FindAllStringIndex(src, -1) {
		args := splitArgs(src[loc[1]:])
		if len(args) == 0 {
			problems = append(problems, "a call without arguments")
			continue
		}
		name := unquote(args[0])
		if name == args[0] {
			problems = append(problems, "a command named at run time: "+args[0])
			continue
		}
		pos, ok := keyArgs[strings.ToUpper(name)]
		if !ok {
			problems = append(problems, "command "+name+" is not in keyArgs (add it with its key positions)")
			continue
		}
		for _, i := range pos(args[1:]) {
			if i >= len(args) {
				problems = append(problems, name+": missing key argument")
				continue
			}
			a := strings.TrimSpace(args[i])
			if !keysRe.MatchString(a) && !fromKeys[a] {
				problems = append(problems, name+": key "+a+" is not one of the script's KEYS")
			}
		}
	}
	return problems
}

// splitArgs splits the arguments of a call whose text starts just after
// its opening parenthesis.
func splitArgs(s string) []string {
	var args []string
	depth, start := 0, 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			if depth == 0 {
				if a := strings.TrimSpace(s[start:i]); a != "" || len(args) > 0 {
					args = append(args, a)
				}
				return args
			}
			depth--
		case c == ',' && depth == 0:
			args = append(args, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return args
}

func unquote(s string) string {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "go.mod not found")
		dir = parent
	}
}
