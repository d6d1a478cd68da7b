package engine

import (
	"encoding/json"
	"fmt"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/errs"
)

// checkPriority refuses a run priority out of range.
func checkPriority(p int) error {
	if p < dag.MinPriority || p > dag.MaxPriority {
		e := errs.E(errs.Invalid, "priority must be between %d and %d", dag.MinPriority, dag.MaxPriority)
		e.Fields = []errs.Field{{Field: "priority", Message: fmt.Sprintf("between %d and %d", dag.MinPriority, dag.MaxPriority)}}
		return e
	}
	return nil
}

// taskConfig is the config stored with one task: its node's executor
// settings plus, when they apply, the task's priority and its rate limit
// with the key the state machine evaluated (the lease path and the sweeps
// read them from the task, so every re-dispatch keeps them).
func taskConfig(base json.RawMessage, n *dag.Node, priority int, rateKey string) json.RawMessage {
	if priority == 0 && (n == nil || n.RateLimit == nil) {
		return base
	}
	var cfg taskapi.TaskConfig
	if err := json.Unmarshal(base, &cfg); err != nil {
		panic(fmt.Sprintf("engine: node config does not decode: %v", err)) // nodeConfig wrote it
	}
	cfg.Priority = priority
	if n != nil && n.RateLimit != nil {
		cfg.RateLimit = &taskapi.RateLimitRef{Name: n.RateLimit.Name, Key: rateKey}
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(fmt.Sprintf("engine: marshal task config: %v", err)) // plain data
	}
	return b
}
