"""The Python path of the evidence summary: the memo gives what a fresh parse gives, and parses
each distinct document once."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from run_otel.source import evidence
from run_otel.source.evidence import EvidenceParser, summarize

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
