// Package dag is the workflow definition model: a directed acyclic graph of
// nodes, parsed from JSON or YAML, validated, and compiled once so the state
// machine can evaluate its expressions cheaply.
//
// A definition that Parse accepts is safe to run: every dependency exists,
// there is no cycle, every duration and type-specific setting is valid, and
// every CEL expression compiles and only reads the run input and the outputs
// of nodes upstream of the node that uses it. When Parse rejects a
// definition it returns a *ValidationError listing every problem, each
// naming the node and field.
//
//	wf, err := dag.Parse([]byte(`{
//	  "nodes": [
//	    {"id": "charge", "type": "http", "http": {"method": "POST", "url": "https://pay.example/charge"},
//	     "input": {"amount": "input.amount"}},
//	    {"id": "receipt", "type": "http", "depends_on": ["charge"],
//	     "if": "nodes.charge.output.status == 200",
//	     "http": {"method": "POST", "url": "https://mail.example/send"},
//	     "input": {"charge_id": "nodes.charge.output.body.id"}}
//	  ]}`))
//
// The package does no I/O and reads no clock; a *Workflow is immutable after
// Parse and safe for concurrent use.
package dag
