"""Chinese documents: cleaning and chunking keep sentences whole and find Chinese headings (issue 20)."""

import re

from rag_studio.pipeline.chunking import chunk_pages, heading_of
from rag_studio.pipeline.cleaning import clean_pages
from rag_studio.pipeline.parsing import ParsedPage

SENTENCES = [
    "巡检人员每两小时记录一次反应釜的温度和压力。",
    "班长说：“压力超过一点六兆帕时必须立即停止进料。”",
    "发现泄漏时，先关闭上游阀门，再报告中控室！",
    "冷却水中断怎么办？",
    "按应急预案第三条处理；处理完毕后填写事故记录……",
    "所有记录保存三年，以备审核。",
]
SENTENCE_END = re.compile(r"[。！？；…][”’」』）]*$")


def test_recursive_chunks_of_chinese_prose_end_at_sentence_ends_and_never_start_with_a_closing_quote():
    text = "".join(SENTENCES * 6)

    chunks = chunk_pages([ParsedPage(text, 1)], {"mode": "recursive", "chunk_size": 120, "chunk_overlap": 40})

    assert len(chunks) > 3
    for chunk in chunks:
        assert SENTENCE_END.search(chunk.text), chunk.text
        assert not chunk.text.startswith(("”", "’", "）")), chunk.text
        assert text[chunk.start:chunk.end] == chunk.text


def test_a_sentence_is_cut_only_when_it_alone_is_longer_than_the_chunk():
    long_sentence = "反应釜" + "、".join(f"{n}号阀门" for n in range(1, 40)) + "必须每班检查。"
    text = SENTENCES[0] + long_sentence + SENTENCES[1]

    chunks = chunk_pages([ParsedPage(text, 1)], {"mode": "recursive", "chunk_size": 100, "chunk_overlap": 0})

    assert chunks[0].text == SENTENCES[0]
    assert chunks[-1].text == SENTENCES[1]


def test_chinese_headings_are_recognised_with_their_levels():
    assert heading_of("第一章 总则") == (1, "第一章 总则")
    assert heading_of("第二节　巡检要求") == (2, "第二节　巡检要求")
    assert heading_of("一、目的") == (3, "一、目的")
    assert heading_of("（二）适用范围") == (4, "（二）适用范围")
    assert heading_of("3.2 点检内容") == (2, "3.2 点检内容")
    # Sentences that open like headings are body text, and so is English numbering.
    assert heading_of("（一）进入车间必须佩戴安全帽。") is None
    assert heading_of("第十二条 设备停机检修前，应切断电源并挂牌上锁，"
                      "经班长确认后方可作业，严禁带电检修任何设备。") is None
    assert heading_of("1.1 Install the agent") is None


def test_heading_mode_gives_chinese_sections_their_heading_path():
    text = ("第一章 总则\n本手册适用于一号装置。\n一、目的\n规范巡检工作。\n（一）适用范围\n"
            "适用于全体操作人员。\n第二章 巡检\n一、频次\n每两小时一次。")

    chunks = chunk_pages([ParsedPage(text, None)], {"mode": "heading", "chunk_size": 800, "chunk_overlap": 0})

    assert [chunk.heading for chunk in chunks] == [
        "第一章 总则", "第一章 总则 > 一、目的", "第一章 总则 > 一、目的 > （一）适用范围", "第二章 巡检 > 一、频次"]
    assert chunks[2].text == "（一）适用范围\n适用于全体操作人员。"


def test_cleaning_drops_chinese_indentation_and_letter_spacing_and_folds_full_width_forms():
    page = ParsedPage("\u3000\u3000本装置额定压力为１．６ＭＰａ，温度不超过１８０℃。\n安 全 操 作 规 程\n"
                      "Keep  the   English   spacing.", None)

    [cleaned] = clean_pages([page])

    assert cleaned.text == ("本装置额定压力为1.6MPa，温度不超过180°C。\n安全操作规程\nKeep the English spacing.")


def test_cleaning_joins_a_pdfs_wrapped_chinese_lines_but_not_titles_or_items():
    wrapped = ("第一章 总则\n本手册适用于华东化工园区一号装置的全体操作人员、检修人员以及进入装\n"
               "置区域的承包商人员，进入装置前必须完成三级安全培训并通过考试合格。\n"
               "（一）进入车间必须佩戴安全帽。\n（二）严禁携带火种。")

    [pdf_page] = clean_pages([ParsedPage(wrapped, 1)])
    [text_file] = clean_pages([ParsedPage(wrapped, None)])

    assert pdf_page.text == ("第一章 总则\n本手册适用于华东化工园区一号装置的全体操作人员、检修人员以及进入装"
                             "置区域的承包商人员，进入装置前必须完成三级安全培训并通过考试合格。\n"
                             "（一）进入车间必须佩戴安全帽。\n（二）严禁携带火种。")
    assert text_file.text == wrapped
