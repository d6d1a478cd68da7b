-- Per-plan bounds on what a tenant can accumulate (tenants.Limits):
-- signals per run, versions per workflow, live API keys and webhook
-- endpoints. Operators override them per tenant like any other limit.

-- +goose Up
UPDATE plans SET limits = limits || '{"max_signals_per_run": 100, "max_workflow_versions": 100, "max_api_keys": 20, "max_webhook_endpoints": 5}'::jsonb
 WHERE name = 'free';
UPDATE plans SET limits = limits || '{"max_signals_per_run": 1000, "max_workflow_versions": 1000, "max_api_keys": 200, "max_webhook_endpoints": 20}'::jsonb
 WHERE name = 'pro';
UPDATE plans SET limits = limits || '{"max_signals_per_run": 10000, "max_workflow_versions": 10000, "max_api_keys": 1000, "max_webhook_endpoints": 100}'::jsonb
 WHERE name = 'enterprise';

-- +goose Down
UPDATE plans SET limits = limits - 'max_signals_per_run' - 'max_workflow_versions' - 'max_api_keys' - 'max_webhook_endpoints';
