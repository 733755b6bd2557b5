"""Chunking, pinned on realistic policy documents in English and Chinese.

Every chunk must be locatable: page.text[start:end] is exactly the chunk's text (chunks are stripped, so offsets point
at the stripped text).
"""

import pytest

from rag_studio.pipeline.chunking import DEFAULT_CHUNKING, ChunkDraft, chunk_pages, validate_chunking
from rag_studio.pipeline.parsing import ParsedPage

POLICY_MD = """\
This handbook applies to all staff and contractors.

# Security policy

## Passwords

Passwords must be at least 12 characters long. They must not be reused across systems, and they must be changed \
after any suspected compromise. Password managers approved by IT may be used to store them.

密码长度不得少于十二个字符。不得在不同系统之间重复使用密码！发现可疑泄露后必须立即更换密码。

```bash
# rotate the service password; this line is code, not a heading
vault write auth/rotate
```

## Remote access

Remote access requires the company VPN and a hardware security key.

# 附录

## 联系方式

信息安全团队：security@example.com。
"""

CHINESE_PARAGRAPH = (
    "人工智能工厂为企业提供本地部署的检索增强生成服务。用户可以上传文档并建立知识库！"
    "系统会自动解析文档、切分文本并生成向量索引。检索时，系统先找到相关片段，再交给语言模型生成答案？"
    "所有数据都保存在企业自己的服务器上，不会发送到外部。管理员可以随时查看和删除数据。"
)

ENGLISH_PARAGRAPH = (
    "Retrieval quality depends on chunking. Chunks that are too small lose context; chunks that are too large dilute "
    "the embedding. A good default keeps paragraphs together and splits long ones at sentence ends. "
)


def assert_locatable(chunks: list[ChunkDraft], pages: list[ParsedPage]) -> None:
    by_number = {page.page: page for page in pages}
    for chunk in chunks:
        page_text = by_number[chunk.page].text
        assert page_text[chunk.start:chunk.end] == chunk.text
        assert chunk.text == chunk.text.strip() and chunk.text


def non_space_positions(text: str) -> set[int]:
    return {index for index, character in enumerate(text) if not character.isspace()}


def covered_positions(chunks: list[ChunkDraft]) -> set[int]:
    return {index for chunk in chunks for index in range(chunk.start, chunk.end)}


def test_defaults_fill_an_empty_config():
    assert validate_chunking({}) == DEFAULT_CHUNKING
    assert validate_chunking({"mode": "parent_child"}) == {
        "mode": "parent_child", "parent_size": 2000, "child_size": 400, "child_overlap": 50}


def test_recursive_chunks_cover_mixed_text_within_size_and_stay_on_their_page():
    pages = [ParsedPage(ENGLISH_PARAGRAPH * 4 + "\n\n" + CHINESE_PARAGRAPH, 1),
             ParsedPage(CHINESE_PARAGRAPH + "\n\n" + ENGLISH_PARAGRAPH * 3, 2)]

    chunks = chunk_pages(pages, {"mode": "recursive", "chunk_size": 120, "chunk_overlap": 20})

    assert_locatable(chunks, pages)
    assert all(len(chunk.text) <= 120 for chunk in chunks)
    assert [chunk.page for chunk in chunks] == sorted(chunk.page for chunk in chunks)
    for page in pages:
        assert covered_positions([c for c in chunks if c.page == page.page]) >= non_space_positions(page.text)
    assert all(chunk.searchable and chunk.parent is None and chunk.heading == "" for chunk in chunks)


def test_recursive_splits_chinese_at_sentence_ends():
    page = ParsedPage(CHINESE_PARAGRAPH, None)

    chunks = chunk_pages([page], {"chunk_size": 60, "chunk_overlap": 0})

    assert len(chunks) > 1
    assert all(chunk.text[-1] in "。！？" for chunk in chunks)
    assert "".join(chunk.text for chunk in chunks) == CHINESE_PARAGRAPH


def test_consecutive_chunks_overlap_by_at_most_the_overlap():
    # A keyword list without sentence ends is split between words, small enough pieces to repeat in the overlap.
    page = ParsedPage(" ".join(f"keyword{number}" for number in range(200)), 1)

    chunks = chunk_pages([page], {"chunk_size": 150, "chunk_overlap": 40})

    assert_locatable(chunks, [page])
    for earlier, later in zip(chunks, chunks[1:]):
        assert earlier.start < later.start
        assert 0 < earlier.end - later.start <= 40


def test_offsets_point_at_the_right_copy_of_repeated_text():
    paragraph = "The same disclaimer appears on every page of the contract."
    page = ParsedPage("\n\n".join([paragraph] * 12), 1)

    chunks = chunk_pages([page], {"chunk_size": 130, "chunk_overlap": 0})

    assert_locatable(chunks, [page])
    starts = [chunk.start for chunk in chunks]
    assert starts == sorted(set(starts))
    assert covered_positions(chunks) >= non_space_positions(page.text)


def test_a_sentence_across_a_page_break_is_not_joined():
    pages = [ParsedPage("The retention period for audit logs is", 4), ParsedPage("seven years.", 5)]

    chunks = chunk_pages(pages, DEFAULT_CHUNKING)

    assert [(chunk.page, chunk.text) for chunk in chunks] == [
        (4, "The retention period for audit logs is"), (5, "seven years.")]


def test_blank_pages_give_no_chunks():
    assert chunk_pages([ParsedPage("", 1), ParsedPage(" \n\n\t ", 2)], DEFAULT_CHUNKING) == []


def test_heading_sections_keep_their_heading_line_and_path():
    page = ParsedPage(POLICY_MD, None)

    chunks = chunk_pages([page], {"mode": "heading"})

    assert_locatable(chunks, [page])
    assert [chunk.heading for chunk in chunks] == [
        "", "Security policy > Passwords", "Security policy > Remote access", "附录 > 联系方式"]
    preamble, passwords, remote, contact = chunks
    assert preamble.text == "This handbook applies to all staff and contractors."
    # A title with no body of its own stays with its first subsection.
    assert passwords.text.startswith("# Security policy\n\n## Passwords\n\nPasswords must")
    # The "#" comment inside the code fence does not start a section.
    assert passwords.text.endswith("vault write auth/rotate\n```")
    assert remote.text.startswith("## Remote access\n")
    assert contact.text == "# 附录\n\n## 联系方式\n\n信息安全团队：security@example.com。"


def test_long_sections_are_split_and_keep_their_heading():
    page = ParsedPage(POLICY_MD, None)

    chunks = chunk_pages([page], {"mode": "heading", "chunk_size": 100, "chunk_overlap": 0})

    assert_locatable(chunks, [page])
    assert all(len(chunk.text) <= 100 for chunk in chunks)
    password_chunks = [chunk for chunk in chunks if chunk.heading == "Security policy > Passwords"]
    assert len(password_chunks) > 2
    assert any("密码长度不得少于十二个字符。" in chunk.text for chunk in password_chunks)


def test_max_heading_level_keeps_deeper_headings_inside_the_section():
    page = ParsedPage(POLICY_MD, None)

    chunks = chunk_pages([page], {"mode": "heading", "chunk_size": 2000, "max_heading_level": 1})

    assert [chunk.heading for chunk in chunks] == ["", "Security policy", "附录"]
    assert "## Remote access" in chunks[1].text


def test_closing_hashes_and_hash_words_in_headings():
    page = ParsedPage("## C# coding rules ##\nUse four spaces.\n\n#hashtag is not a heading", None)

    [chunk] = chunk_pages([page], {"mode": "heading"})

    assert chunk.heading == "C# coding rules"


def test_parent_child_children_point_to_the_parent_they_lie_in():
    pages = [ParsedPage(ENGLISH_PARAGRAPH * 12, 1), ParsedPage(CHINESE_PARAGRAPH * 6, 2)]
    config = {"mode": "parent_child", "parent_size": 600, "child_size": 150, "child_overlap": 30}

    chunks = chunk_pages(pages, config)

    assert_locatable(chunks, pages)
    parents = [index for index, chunk in enumerate(chunks) if not chunk.searchable]
    assert len(parents) >= 4 and {chunks[index].page for index in parents} == {1, 2}
    for index, chunk in enumerate(chunks):
        if chunk.searchable:
            parent = chunks[chunk.parent]
            assert chunk.parent < index and not parent.searchable and parent.parent is None
            assert parent.page == chunk.page and parent.start <= chunk.start and chunk.end <= parent.end
            assert len(chunk.text) <= 150
        else:
            assert chunk.parent is None and len(chunk.text) <= 600
            assert any(child.parent == index for child in chunks)
    for page in pages:
        page_parents = [chunks[index] for index in parents if chunks[index].page == page.page]
        # Parents tile the page without overlapping: retrieval never returns the same text twice.
        assert all(earlier.end <= later.start for earlier, later in zip(page_parents, page_parents[1:]))
        assert covered_positions(page_parents) >= non_space_positions(page.text)


def test_a_short_parent_has_one_child_with_the_same_text():
    chunks = chunk_pages([ParsedPage("  Short note.  ", 1)], {"mode": "parent_child"})

    assert [(c.text, c.start, c.end, c.parent, c.searchable) for c in chunks] == [
        ("Short note.", 2, 13, None, False), ("Short note.", 2, 13, 0, True)]


def test_delimiter_splits_exactly_and_drops_empty_pieces():
    text = ("Q: How do I reset my password?\nA: Use the portal.\n\n---\n\n\n\n---\n\n"
            "  Q: 如何申请VPN？\nA: 联系IT。  \n\n---\n\n")
    page = ParsedPage(text, 3)

    chunks = chunk_pages([page], {"mode": "delimiter", "delimiter": "\n\n---\n\n"})

    assert_locatable(chunks, [page])
    assert [chunk.text for chunk in chunks] == [
        "Q: How do I reset my password?\nA: Use the portal.", "Q: 如何申请VPN？\nA: 联系IT。"]


def test_delimiter_pieces_longer_than_chunk_size_are_split():
    long_piece = ENGLISH_PARAGRAPH * 3
    page = ParsedPage(f"Short piece.###{long_piece}###Another short piece.", 1)

    chunks = chunk_pages([page], {"mode": "delimiter", "delimiter": "###", "chunk_size": 200, "chunk_overlap": 0})

    assert_locatable(chunks, [page])
    assert chunks[0].text == "Short piece." and chunks[-1].text == "Another short piece."
    middle = chunks[1:-1]
    assert len(middle) > 1 and all(len(chunk.text) <= 200 for chunk in middle)
    assert "###" not in "".join(chunk.text for chunk in chunks)


@pytest.mark.parametrize(("config", "named"), [
    ({"mode": "semantic"}, "mode"),
    ({"chunk_size": 49}, "chunk_size"),
    ({"chunk_size": 8001}, "chunk_size"),
    ({"chunk_size": "800"}, "chunk_size"),
    ({"chunk_size": True}, "chunk_size"),
    ({"chunk_size": 500, "chunk_overlap": 500}, "chunk_overlap"),
    ({"chunk_overlap": -1}, "chunk_overlap"),
    ({"mode": "delimiter"}, "delimiter"),
    ({"mode": "delimiter", "delimiter": ""}, "delimiter"),
    ({"mode": "delimiter", "delimiter": 3}, "delimiter"),
    ({"mode": "parent_child", "parent_size": 400, "child_size": 400}, "child_size"),
    ({"mode": "parent_child", "child_size": 100, "child_overlap": 100}, "child_overlap"),
    ({"mode": "parent_child", "parent_size": 9000}, "parent_size"),
    ({"mode": "heading", "max_heading_level": 7}, "max_heading_level"),
    ({"chunksize": 800}, "chunksize"),
])
def test_validation_names_the_bad_setting(config, named):
    with pytest.raises(ValueError, match=named):
        validate_chunking(config)


def test_validation_keeps_only_the_settings_of_the_mode():
    config = {"mode": "delimiter", "delimiter": "###", "chunk_size": 300, "parent_size": 2000}

    assert validate_chunking(config) == {"mode": "delimiter", "delimiter": "###", "chunk_size": 300,
                                         "chunk_overlap": 100}


def test_chunk_pages_rejects_a_bad_config():
    with pytest.raises(ValueError, match="chunk_overlap"):
        chunk_pages([ParsedPage("text", 1)], {"chunk_size": 100, "chunk_overlap": 200})
