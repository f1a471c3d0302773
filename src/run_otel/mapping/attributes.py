"""Every span attribute key run-otel writes, named once.

Keys the OpenTelemetry semantic conventions define come from
opentelemetry-semantic-conventions; the rest are run-otel's own
``diagnosis.*``, ``rag.*`` and ``tool.*`` namespaces, and the OpenInference
keys that Arize Phoenix and Langfuse read.
"""

from typing import Final

from opentelemetry.semconv._incubating.attributes import deployment_attributes
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.attributes import service_attributes as incubating_service
from opentelemetry.semconv._incubating.attributes import session_attributes as session
from opentelemetry.semconv.attributes import error_attributes, exception_attributes, service_attributes

# Annotated: the compiled build checks this module without the conventions package installed.
# Final: the compiled modules read them as C constants, not by a lookup in this module at each use.

DEPLOYMENT_ENVIRONMENT_NAME: Final[str] = deployment_attributes.DEPLOYMENT_ENVIRONMENT_NAME
GEN_AI_OPERATION_NAME: Final[str] = gen_ai.GEN_AI_OPERATION_NAME
GEN_AI_AGENT_NAME: Final[str] = gen_ai.GEN_AI_AGENT_NAME
GEN_AI_PROVIDER_NAME: Final[str] = gen_ai.GEN_AI_PROVIDER_NAME
GEN_AI_CONVERSATION_ID: Final[str] = gen_ai.GEN_AI_CONVERSATION_ID
GEN_AI_TOOL_NAME: Final[str] = gen_ai.GEN_AI_TOOL_NAME
GEN_AI_TOOL_CALL_ID: Final[str] = gen_ai.GEN_AI_TOOL_CALL_ID
GEN_AI_TOOL_TYPE: Final[str] = gen_ai.GEN_AI_TOOL_TYPE
GEN_AI_TOOL_CALL_ARGUMENTS: Final[str] = gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS
GEN_AI_TOOL_CALL_RESULT: Final[str] = gen_ai.GEN_AI_TOOL_CALL_RESULT
SESSION_ID: Final[str] = session.SESSION_ID
ERROR_TYPE: Final[str] = error_attributes.ERROR_TYPE
SERVICE_NAME: Final[str] = service_attributes.SERVICE_NAME
SERVICE_VERSION: Final[str] = service_attributes.SERVICE_VERSION
SERVICE_NAMESPACE: Final[str] = incubating_service.SERVICE_NAMESPACE

OPERATION_INVOKE_AGENT: Final = "invoke_agent"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_RETRIEVAL: Final[str] = gen_ai.GenAiOperationNameValues.RETRIEVAL.value
GEN_AI_DATA_SOURCE_ID: Final[str] = gen_ai.GEN_AI_DATA_SOURCE_ID
GEN_AI_RETRIEVAL_DOCUMENTS: Final[str] = gen_ai.GEN_AI_RETRIEVAL_DOCUMENTS
TOOL_TYPE_DATASTORE: Final = "datastore"
TOOL_TYPE_FUNCTION: Final = "function"

ERROR_RUN_FAILED: Final = "run_failed"
ERROR_RUN_FALLBACK: Final = "run_fallback"
ERROR_RUN_CANCELLED: Final = "run_cancelled"
ERROR_RUN_INCOMPLETE: Final = "run_incomplete"
ERROR_TOOL: Final = "tool_error"
# The span event the SDK's record_exception writes.
EXCEPTION_EVENT: Final = "exception"
EXCEPTION_TYPE: Final[str] = exception_attributes.EXCEPTION_TYPE
EXCEPTION_MESSAGE: Final[str] = exception_attributes.EXCEPTION_MESSAGE

# diagnosis_run
RUN_ID: Final = "diagnosis.run.id"
RUN_STATUS: Final = "diagnosis.run.status"
RUN_INTENT: Final = "diagnosis.run.intent"
RUN_RELEASE_OUTCOME: Final = "diagnosis.run.release_outcome"
RUN_AGENT_FLOW: Final = "diagnosis.run.agent_flow"
RUN_STEP_COUNT: Final = "diagnosis.run.step_count"
RUN_TOOL_CALL_COUNT: Final = "diagnosis.run.tool_call_count"
RUN_TOTAL_TOKEN_COUNT: Final = "diagnosis.run.total_token_count"
RUN_DURATION_MS: Final = "diagnosis.run.duration_ms"
RUN_INCOMPLETE: Final = "diagnosis.run.incomplete"
# On the span that brings the final outcome of a run first sent as incomplete.
RUN_COMPLETED_LATE: Final = "diagnosis.run.completed_late"
# The span name's suffix of that span: "invoke_agent {agent} completed".
COMPLETION_SUFFIX: Final = "completed"
RUN_QUERY: Final = "diagnosis.run.query"
RUN_ANSWER: Final = "diagnosis.run.answer"
RUN_PUBLISHED_RESULT: Final = "diagnosis.run.published_result"
# Set only when a run has more tool rows than trace.max_spans_per_trace.
RUN_TOOL_SPAN_LIMIT: Final = "diagnosis.run.tool_span_limit"
RUN_TOOL_SPANS_DROPPED: Final = "diagnosis.run.tool_spans_dropped"
# Set only on the root of a later diagnosis_run row whose run_id an earlier row already has: its own
# primary key, and the one of the row that owns the run id's trace (which its span links to).
RUN_ROW_ID: Final = "diagnosis.run.row_id"
RUN_DUPLICATE_OF_ROW_ID: Final = "diagnosis.run.duplicate_of_row_id"
# That root's name's suffix: "invoke_agent {agent} duplicate", so a trace list tells it from the first.
DUPLICATE_SUFFIX: Final = "duplicate"
STEP_ID: Final = "diagnosis.step.id"
# The keys of a span's attributes that were cut short or removed to fit the limits.
RUN_OTEL_ATTRIBUTES_CUT: Final = "run_otel.attributes.cut"

# tool_invocation
RAG_RETRIEVAL_LAYER: Final = "rag.retrieval_layer"
RAG_L0_MATCH_COUNT: Final = "rag.l0_match_count"
RAG_L1_MATCH_COUNT: Final = "rag.l1_match_count"
RAG_RELEVANCE_LEVEL: Final = "rag.relevance_level"
RAG_DEDUP_REASON: Final = "rag.dedup_reason"
RAG_EVIDENCE_STATUS: Final = "rag.evidence.status"
RAG_EVIDENCE_COUNT: Final = "rag.evidence.count"
RAG_EVIDENCE_PATHS: Final = "rag.evidence.paths"
RAG_EVIDENCE_REFS: Final = "rag.evidence.refs"
TOOL_OUTPUT_LENGTH: Final = "tool.output_length"
TOOL_OUTPUT_TRUNCATED: Final = "tool.output_truncated"
TOOL_DURATION_MS: Final = "tool.duration_ms"

# user feedback, as a GenAI evaluation
GEN_AI_EVALUATION_NAME: Final[str] = gen_ai.GEN_AI_EVALUATION_NAME
GEN_AI_EVALUATION_SCORE_LABEL: Final[str] = gen_ai.GEN_AI_EVALUATION_SCORE_LABEL
GEN_AI_EVALUATION_SCORE_VALUE: Final[str] = gen_ai.GEN_AI_EVALUATION_SCORE_VALUE
GEN_AI_EVALUATION_RESULT_EVENT: Final = "gen_ai.evaluation.result"
# When the user rated (ISO 8601, UTC): the span sits inside the run, not at this time.
FEEDBACK_RATED_AT: Final = "diagnosis.feedback.rated_at"
# On the span that marks a rating superseded: the rating that replaced it, and when that was given.
FEEDBACK_SUPERSEDED_BY: Final = "diagnosis.feedback.superseded_by"
OI_KIND_EVALUATOR: Final = "EVALUATOR"

# OpenInference profile
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OI_TOOL_NAME: Final = "tool.name"
OI_INPUT_VALUE: Final = "input.value"
OI_OUTPUT_VALUE: Final = "output.value"
OI_INPUT_MIME_TYPE: Final = "input.mime_type"
OI_OUTPUT_MIME_TYPE: Final = "output.mime_type"
OI_KIND_AGENT: Final = "AGENT"
OI_KIND_TOOL: Final = "TOOL"
OI_KIND_RETRIEVER: Final = "RETRIEVER"
OI_PROJECT_NAME: Final = "openinference.project.name"
MIME_JSON: Final = "application/json"
MIME_TEXT: Final = "text/plain"
# retrieval.documents.<N>.document.<field>: one flattened list entry per evidence ref.
OI_RETRIEVAL_DOCUMENTS: Final = "retrieval.documents"
OI_DOCUMENT_ID: Final = "document.id"
OI_DOCUMENT_CONTENT: Final = "document.content"
OI_DOCUMENT_METADATA: Final = "document.metadata"
OI_DOCUMENT_SCORE: Final = "document.score"
# Evidence-ref keys that hold a document's own, stable id, in order of preference.
DOCUMENT_ID_KEYS = ("doc_id", "document_id")
# rag.relevance_level as a document score (higher is more relevant), so a UI can sort by it.
RELEVANCE_SCORES = {"PRECISE": 1.0, "HIGHLY_RELEVANT": 0.75, "REFERENCE": 0.5, "DEDUPED": 0.25}
# evidence_refs' marker for "this call found no evidence": not a document.
NO_EVIDENCE_PATH: Final = "$.no_evidence"

SCOPE_NAME: Final = "run_otel"
# The GenAI conventions followed, pinned: semantic-conventions-genai v0.1.0 (every gen_ai span,
# event and attribute still Development). Its release script names schemas gen-ai/<version>.
GEN_AI_CONVENTIONS_VERSION: Final = "0.1.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/gen-ai/{GEN_AI_CONVENTIONS_VERSION}"
