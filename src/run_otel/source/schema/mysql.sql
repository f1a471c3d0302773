-- The agent's two tables as its Flyway migrations create them
-- (V005, V010 and V011): exactly the columns, types and indexes of the
-- data dictionary. run-otel reads them; it never creates them in production.
-- The tests, the benchmark and the compose stack load this file.

CREATE TABLE IF NOT EXISTS diagnosis_run (
    id                BIGINT       NOT NULL AUTO_INCREMENT,
    run_id            VARCHAR(64)  NOT NULL,
    session_id        VARCHAR(64)  NOT NULL,
    query             TEXT         NOT NULL,
    status            VARCHAR(16)  NULL,
    agent_flow        VARCHAR(32)  NULL,
    answer            LONGTEXT     NULL,
    intent            VARCHAR(32)  NULL,
    release_outcome   VARCHAR(16)  NULL,
    published_result  JSON         NULL,
    self_evaluation   JSON         NULL,
    feedback          VARCHAR(16)  NULL,
    total_duration_ms INT          NULL,
    total_token_count INT          NULL,
    step_count        INT          NULL,
    tool_call_count   INT          NULL,
    created_at        DATETIME     NOT NULL,
    updated_at        DATETIME     NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY run_id (run_id),
    KEY idx_diagnosis_run_session_created (session_id, created_at, id),
    KEY idx_diagnosis_run_session_run (session_id, run_id),
    KEY idx_diagnosis_run_status (status),
    KEY idx_diagnosis_run_agent_flow (agent_flow)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS tool_invocation (
    id                BIGINT       NOT NULL AUTO_INCREMENT,
    session_id        VARCHAR(64)  NOT NULL,
    run_id            VARCHAR(64)  NULL,
    step_id           BIGINT       NULL,
    tool_name         VARCHAR(64)  NOT NULL,
    input_params      JSON         NOT NULL,
    output_preview    TEXT         NULL,
    output_length     INT          NULL,
    retrieval_layer   VARCHAR(8)   NULL,
    l0_match_count    INT          NULL,
    l1_match_count    INT          NULL,
    is_truncated      BOOLEAN      NULL,
    relevance_level   VARCHAR(20)  NULL,
    dedup_reason      VARCHAR(32)  NULL,
    retrieval_details JSON         NULL,
    duration_ms       INT          NULL,
    success           BOOLEAN      NULL,
    error_message     TEXT         NULL,
    created_at        DATETIME     NOT NULL,
    PRIMARY KEY (id),
    KEY idx_session_id (session_id),
    KEY idx_tool_invocation_run_id (run_id, id),
    KEY idx_tool_name (tool_name),
    KEY idx_retrieval_layer (retrieval_layer)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
