-- Who started a run and who sent a signal, and which runs' input derives
-- from a secret (issue 30, points 5 and 6).
--
-- workflow_runs.started_by is the principal that started the run, as the
-- server authenticated it ("user:<subject>", "api_key:<key id>",
-- "schedule:<id>"; a child run inherits its parent's; NULL for runs
-- started before it was recorded or by the platform itself): an approval
-- policy's not_starter refuses it. run_signals.sent_by is the principal
-- that sent a signal, recorded with a signal kept for a wait not reached
-- yet so that the approval it becomes names its real sender.
--
-- workflow_runs.secret_input marks a child run whose input was built from
-- a step that read a secret (or whose parent's input was): every value of
-- such a run counts as derived from a secret, which the API shows only to
-- principals with secrets:outputs. Which nodes of a run derive from a
-- secret otherwise follows from its definition (engine/dag, secrets.go).
-- API keys may hold secrets:outputs, the scope that reads them.

-- +goose Up
ALTER TABLE workflow_runs
    ADD COLUMN started_by   text CHECK (length(started_by) BETWEEN 3 AND 300),
    ADD COLUMN secret_input boolean NOT NULL DEFAULT false;
ALTER TABLE run_signals ADD COLUMN sent_by text CHECK (length(sent_by) BETWEEN 3 AND 300);

ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['runs:read', 'runs:write',
    'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
    'billing:read', 'worker', 'events:write', 'secrets:manage', 'secrets:outputs', 'admin']);

-- +goose Down
UPDATE api_keys SET scopes = array_remove(scopes, 'secrets:outputs') WHERE 'secrets:outputs' = ANY (scopes) AND cardinality(scopes) > 1;
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['runs:read', 'runs:write',
    'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
    'billing:read', 'worker', 'events:write', 'secrets:manage', 'admin']);
ALTER TABLE run_signals DROP COLUMN sent_by;
ALTER TABLE workflow_runs DROP COLUMN secret_input, DROP COLUMN started_by;
