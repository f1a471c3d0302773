-- The bridge's database user: SELECT on the two tables it reads, nothing else.
-- The password is the compose demo's (deploy/secrets/run-otel-db-password);
-- use your own secret anywhere else.
CREATE USER IF NOT EXISTS 'run_otel'@'%' IDENTIFIED BY 'run-otel-demo-only';
GRANT SELECT ON agent.diagnosis_run TO 'run_otel'@'%';
GRANT SELECT ON agent.tool_invocation TO 'run_otel'@'%';
