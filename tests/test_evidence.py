"""The Python path of the evidence summary: the memo gives what a fresh parse gives, and parses
each distinct document once; the retrieval documents' memo encodes each once, and gives what a
fresh encoding gives."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from run_otel.mapping import documents
from run_otel.mapping.documents import RetrievalDocuments, retrieval_documents
from run_otel.source import evidence
from run_otel.source.evidence import Evidence, EvidenceParser, summarize
from run_otel.source.rows import ToolRow

REF = st.fixed_dictionaries({"raw_path": st.one_of(st.text(max_size=12), st.integers())}, optional={"text": st.text(max_size=20)})
DOCUMENT = st.one_of(
    st.builds(
        lambda status, refs: json.dumps({"evidence_status": status, "evidence_refs": refs}),
        st.one_of(st.none(), st.sampled_from(["supported", "partial"]), st.integers()),
        st.one_of(st.none(), st.lists(REF, max_size=4), st.text(max_size=5)),
    ),
    st.sampled_from(["not json", "[1, 2]", "null", '"text"', "{}"]),
)


@given(st.lists(st.tuples(DOCUMENT, st.integers(1, 10**6)), max_size=30))
def test_the_memo_gives_what_a_fresh_parse_gives_with_each_rows_own_warning(rows):
    parser = EvidenceParser(size=4, max_chars=60)  # small: forgetting and the length cut both happen
    for text, tool_id in rows + rows:  # every document at least twice
        fresh: list[str] = []
        remembered: list[str] = []
        assert parser.summarize(text, remembered, tool_id) == summarize(text, fresh, tool_id)
        assert remembered == fresh


def test_each_distinct_document_is_parsed_once(monkeypatch):
    parsed: list[str] = []
    real = evidence.json.loads

    def counting(text):
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(evidence.json, "loads", counting)
    parser = EvidenceParser()
    documents = [json.dumps({"evidence_status": "supported", "evidence_refs": [{"raw_path": f"$.docs[{i}]"}]}) for i in range(3)]
    for n in range(300):
        parser.summarize(documents[n % 3], [], n)
    assert len(parsed) == 3
    long = json.dumps({"evidence_refs": [{"raw_path": "$.x", "text": "y" * 5000}]})
    for n in range(2):
        parser.summarize(long, [], n)
    assert len(parsed) == 5  # past max_chars: parsed every time, never held


def _tool(level: str | None) -> ToolRow:
    return ToolRow(1, "run-1", 1, "search", None, "L0", 1, 0, False, level, None, None, 5, True, None, None)


LEVEL = st.sampled_from([None, "PRECISE", "PARTIAL", "NONE", "unknown"])
DATABASE_SUMMARY = st.builds(
    lambda status, paths: Evidence(status, len(paths), tuple(paths)),
    st.sampled_from([None, "supported"]),
    st.lists(st.sampled_from(["$.a", "$.b", "$.no_evidence"]), max_size=3),
)


@given(st.lists(st.tuples(st.one_of(DOCUMENT, DATABASE_SUMMARY), LEVEL), max_size=30))
def test_the_documents_memo_gives_what_a_fresh_encoding_gives(rows):
    parser, memo = EvidenceParser(size=3), RetrievalDocuments(size=3)  # small: both forget and fill again
    for details, level in rows + rows:
        parsed = parser.summarize(details, [], 1) if isinstance(details, str) else details
        if parsed is None or not parsed.paths:
            continue
        assert memo(parsed, _tool(level)) == retrieval_documents(parsed, _tool(level))


def test_each_distinct_evidence_and_level_is_encoded_once(monkeypatch):
    encoded: list[object] = []
    real = documents.json.dumps

    def counting(value, **kwargs):
        encoded.append(value)
        return real(value, **kwargs)

    parser, memo = EvidenceParser(), RetrievalDocuments()
    texts = [json.dumps({"evidence_refs": [{"raw_path": f"$.docs[{i}]", "doc_id": f"kb-{i}"}]}) for i in range(3)]
    summary = Evidence("supported", 1, ("$.logs[0]",))
    monkeypatch.setattr(documents.json, "dumps", counting)
    for n in range(300):
        evidence = parser.summarize(texts[n % 3], [], n) if n % 4 else Evidence(*summary)  # equal, not the same
        assert evidence is not None
        memo(evidence, _tool("PRECISE" if n % 2 else "PARTIAL"))
    assert len(encoded) == 3 * 2 + 1  # three documents at both levels; the summary at the one level it met
