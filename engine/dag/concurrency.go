package dag

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// Concurrency strategies: what a start does when its key already has
// Limit runs running.
const (
	// ConcurrencyQueue queues the run (FIFO per key) until one of the
	// key's runs ends.
	ConcurrencyQueue = "queue"
	// ConcurrencyCancelInProgress starts the run and cancels the key's
	// oldest running runs beyond Limit-1.
	ConcurrencyCancelInProgress = "cancel_in_progress"
	// ConcurrencyCancelNewest cancels the new run at once.
	ConcurrencyCancelNewest = "cancel_newest"
)

// Concurrency bounds.
const (
	MaxConcurrencyLimit    = 1000
	MaxConcurrencyKeyChars = 256
)

// ConcurrencySpec limits how many runs of the workflow run at once per key:
// Key is a CEL expression over the run's `input` and `metadata` (a map of
// strings) giving a string, number or boolean; Limit runs of one key run at
// once; Strategy says what a start beyond it does (queue by default).
type ConcurrencySpec struct {
	Key      string `json:"key"`
	Limit    int    `json:"limit"`
	Strategy string `json:"strategy,omitempty"`

	key *program
}

// StrategyName is the spec's strategy or the default.
func (c *ConcurrencySpec) StrategyName() string {
	if c.Strategy == "" {
		return ConcurrencyQueue
	}
	return c.Strategy
}

var (
	concEnvOnce sync.Once
	concEnv     *cel.Env
	concEnvErr  error
)

func (w *Workflow) validateConcurrency(ps *problems) {
	c := w.Concurrency
	if c == nil {
		return
	}
	if c.Limit < 1 || c.Limit > MaxConcurrencyLimit {
		ps.add("", "concurrency.limit", "must be between 1 and %d", MaxConcurrencyLimit)
	}
	switch c.Strategy {
	case "", ConcurrencyQueue, ConcurrencyCancelInProgress, ConcurrencyCancelNewest:
	default:
		ps.add("", "concurrency.strategy", "must be %s, %s or %s", ConcurrencyQueue, ConcurrencyCancelInProgress, ConcurrencyCancelNewest)
	}
	if len(c.Key) > MaxExpressionBytes {
		ps.add("", "concurrency.key", "is longer than %d bytes", MaxExpressionBytes)
		return
	}
	concEnvOnce.Do(func() {
		concEnv, concEnvErr = newEnv(cel.Variable("input", cel.DynType), cel.Variable("metadata", cel.MapType(cel.StringType, cel.StringType)))
	})
	if concEnvErr != nil {
		ps.add("", "concurrency.key", "%v", concEnvErr)
		return
	}
	p, _, err := compileIn(concEnv, c.Key, false)
	if err != nil {
		ps.add("", "concurrency.key", "%v", err)
		return
	}
	c.key = p
}

// ConcurrencyKey evaluates the workflow's concurrency key for a run's
// input and metadata: a string (numbers and booleans as JSON writes them)
// of at most MaxConcurrencyKeyChars. It is "" when the workflow has no
// concurrency limit.
func (w *Workflow) ConcurrencyKey(input json.RawMessage, metadata map[string]string) (string, error) {
	if w.Concurrency == nil || w.Concurrency.key == nil {
		return "", nil
	}
	in, err := DecodeJSON(input)
	if err != nil {
		return "", fmt.Errorf("concurrency.key: run input: %w", err)
	}
	if metadata == nil {
		metadata = map[string]string{}
	}
	v, err := w.Concurrency.key.evalWith(map[string]any{"input": in, "metadata": metadata})
	if err != nil {
		return "", fmt.Errorf("concurrency.key: %w", err)
	}
	return keyString(v, w.Concurrency.key.source)
}

// keyString writes a key's value as a string (numbers and booleans as JSON
// writes them), of 1 to MaxConcurrencyKeyChars characters.
func keyString(v ref.Val, src string) (string, error) {
	var key string
	switch x := v.(type) {
	case types.String:
		key = string(x)
	case types.Int:
		key = strconv.FormatInt(int64(x), 10)
	case types.Uint:
		key = strconv.FormatUint(uint64(x), 10)
	case types.Bool:
		key = strconv.FormatBool(bool(x))
	case types.Double:
		key = strconv.FormatFloat(float64(x), 'g', -1, 64)
	default:
		return "", fmt.Errorf("concurrency.key: %s evaluated to %s, not a string, number or boolean", src, v.Type().TypeName())
	}
	if key == "" {
		return "", fmt.Errorf("concurrency.key: %s evaluated to an empty string", src)
	}
	if len(key) > MaxConcurrencyKeyChars {
		return "", fmt.Errorf("concurrency.key: %s evaluated to %d characters; at most %d", src, len(key), MaxConcurrencyKeyChars)
	}
	return key, nil
}

// StepConcurrency limits how many tasks of one node, across all runs of
// the workflow, hold a slot per key at once: Key is a CEL expression over
// the node's scope (`input`, upstream `nodes`; a map step's also `item` and
// `index`), Limit the slots per key. A task without a slot waits (FIFO per
// key) before it is handed to any worker; it keeps its slot through its
// retries and gives it back when it completes, fails or is cancelled.
// Strategy says what a task that finds no slot does: wait (queue, the
// default), cancel the runs of the key's other tasks beyond Limit-1, the
// oldest first, and take the first slot they free (cancel_in_progress), or
// cancel its own run (cancel_newest).
type StepConcurrency struct {
	Key      string `json:"key"`
	Limit    int    `json:"limit"`
	Strategy string `json:"strategy,omitempty"`

	key *program
}

// StrategyName is the step's strategy or the default.
func (c *StepConcurrency) StrategyName() string {
	if c.Strategy == "" {
		return ConcurrencyQueue
	}
	return c.Strategy
}

func (n *Node) validateStepConcurrency(ps *problems, label string) {
	c := n.Concurrency
	if c == nil {
		return
	}
	if !n.Type.RunsOnWorker() {
		ps.add(label, "concurrency", "is for steps that run on a worker (http, task, noop); a workflow's own limit goes at the top level")
	}
	if c.Limit < 1 || c.Limit > MaxConcurrencyLimit {
		ps.add(label, "concurrency.limit", "must be between 1 and %d", MaxConcurrencyLimit)
	}
	switch c.Strategy {
	case "", ConcurrencyQueue, ConcurrencyCancelInProgress, ConcurrencyCancelNewest:
	default:
		ps.add(label, "concurrency.strategy", "must be %s, %s or %s", ConcurrencyQueue, ConcurrencyCancelInProgress, ConcurrencyCancelNewest)
	}
	switch {
	case c.Key == "":
		ps.add(label, "concurrency.key", "is required")
	case len(c.Key) > MaxExpressionBytes:
		ps.add(label, "concurrency.key", "is longer than %d bytes", MaxExpressionBytes)
	}
}

// StepKey evaluates a worker node's step concurrency key over its scope;
// "" (and limit 0) when the node has none.
func (n *Node) StepKey(s Scope) (string, int, error) {
	c := n.Concurrency
	if c == nil || c.key == nil {
		return "", 0, nil
	}
	v, err := c.key.eval(s)
	if err != nil {
		return "", 0, fmt.Errorf("concurrency.key: %w", err)
	}
	k, err := keyString(v, c.key.source)
	return k, c.Limit, err
}

// ItemStepKey is StepKey of a map node's step for element index.
func (n *Node) ItemStepKey(s Scope, item any, index int) (string, int, error) {
	c := n.Map.Step.Concurrency
	if c == nil || c.key == nil {
		return "", 0, nil
	}
	act, err := s.activation(c.key.refs)
	if err != nil {
		return "", 0, err
	}
	act["item"], act["index"] = item, int64(index)
	v, err := c.key.evalWith(act)
	if err != nil {
		return "", 0, fmt.Errorf("map.step.concurrency.key: %w", err)
	}
	k, err := keyString(v, c.key.source)
	return k, c.Limit, err
}
