"""LaTeX flattening: comment removal, include inlining with its safety problems, main-file choice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from longctx.pipeline.readers.base import UnreadableInput
from longctx.pipeline.readers.latex import (
    find_main_file,
    flatten_latex,
    has_documentclass,
    include_targets,
    strip_comments,
)
from longctx.pipeline.readers.listing import Tree


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def kinds(result) -> list[str]:
    return [problem["kind"] for problem in result.problems]


# --------------------------------------------------------------------------------------------
# Comments
# --------------------------------------------------------------------------------------------


def test_comment_removed_escaped_percent_kept():
    out = strip_comments("Growth of 50\\% per year % TODO check this\nNext line.\n")
    assert "50\\% per year" in out
    assert "TODO" not in out
    assert "Next line." in out


def test_double_backslash_then_percent_is_a_linebreak_then_a_comment():
    out = strip_comments("first row \\\\% secret remark\nsecond row\n")
    assert "first row \\\\" in out
    assert "secret" not in out
    assert "second row" in out


def test_three_backslashes_then_percent_is_linebreak_and_literal_percent():
    out = strip_comments("a \\\\\\% b % gone\n")
    assert "a \\\\\\% b" in out
    assert "gone" not in out


def test_comment_only_lines_disappear_without_leaving_blank_lines():
    out = strip_comments("alpha\n% one\n   % two\n\t%three\nbeta\n")
    assert out == "alpha\nbeta\n"


def test_blank_lines_around_removed_comment_blocks_do_not_pile_up():
    out = strip_comments("alpha\n\n% note\n\n% more\n\n\nbeta\n")
    assert out == "alpha\n\nbeta\n"


def test_verbatim_body_is_untouched():
    body = "% not a comment\n100% sure \\input{notinlined}\n\n\n\nspaced\n"
    src = f"before % c\n\\begin{{verbatim}}\n{body}\\end{{verbatim}} % after-comment\nafter\n"
    out = strip_comments(src)
    assert f"\\begin{{verbatim}}\n{body}\\end{{verbatim}}\nafter\n" in out
    assert "after-comment" not in out
    assert "before\n" in out


def test_lstlisting_body_is_untouched():
    src = "\\begin{lstlisting}[language=Python]\nx = 5 % 3  # modulo\n\\end{lstlisting}\n"
    assert strip_comments(src) == src


def test_commented_out_verbatim_does_not_open_an_environment():
    out = strip_comments("%\\begin{verbatim}\nreal text % real comment\n%\\end{verbatim}\n")
    assert out == "real text\n"


def test_inline_verb_percent_is_not_a_comment():
    out = strip_comments("use \\verb|%d| in C % remark\n")
    assert "\\verb|%d| in C" in out
    assert "remark" not in out


def test_control_space_before_comment_survives():
    out = strip_comments("word\\ % comment\nnext\n")
    assert out.startswith("word\\ ")


def test_documentclass_detection_ignores_comments_and_verbatim():
    assert has_documentclass("\\documentclass{article}\n")
    assert not has_documentclass("% \\documentclass{article}\n")
    assert not has_documentclass("\\begin{verbatim}\n\\documentclass{article}\n\\end{verbatim}\n")
    assert not has_documentclass("\\documentclassfoo\n")


def test_include_targets_static_only():
    code = (
        "\\input{a}\\include{b}\\subfile{c/d}\\input e.tex"
        "\\input{#1}\\input{\\jobname.aux}\\includegraphics{f}\\include x"
    )
    assert include_targets(code) == ["a", "b", "c/d", "e.tex"]


# --------------------------------------------------------------------------------------------
# Includes
# --------------------------------------------------------------------------------------------


@pytest.fixture
def paper(tmp_path: Path) -> Path:
    folder = tmp_path / "paper"
    folder.mkdir()
    return folder


def test_includes_inlined_in_document_order_recursively(paper):
    write(
        paper / "main.tex",
        (
            "\\documentclass{article}\n\\begin{document}\n"
            "\\input{sections/intro}\n"  # no extension, nested folder
            "\\input sections/method.tex\n"  # TeX primitive form
            "\\include{results}\n"
            "\\subfile{appendix/app}\n"
            "\\end{document}\n"
        ),
    )
    write(paper / "sections/intro.tex", "INTRO-START\n\\input{sections/deeper/detail}\nINTRO-END\n")
    write(paper / "sections/deeper/detail.tex", "DETAIL\n")
    write(paper / "sections/method.tex", "METHOD % method comment\n")
    write(paper / "results.tex", "RESULTS\n\\input{table}\n")  # resolved next to results.tex/main
    write(paper / "table.tex", "TABLE\n")
    write(
        paper / "appendix/app.tex",
        ("\\documentclass[../main.tex]{subfiles}\n\\begin{document}\nAPPENDIX\n\\end{document}\n"),
    )
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    order = ["INTRO-START", "DETAIL", "INTRO-END", "METHOD", "RESULTS", "TABLE", "APPENDIX"]
    positions = [result.text.index(marker) for marker in order]
    assert positions == sorted(positions)
    assert "method comment" not in result.text
    assert "\\input" not in result.text and "\\include" not in result.text
    assert "subfiles" not in result.text  # only the subfile's document body is inlined
    assert result.problems == []
    assert result.included == [
        "sections/intro.tex",
        "sections/deeper/detail.tex",
        "sections/method.tex",
        "results.tex",
        "table.tex",
        "appendix/app.tex",
    ]


def test_include_relative_to_the_including_files_folder(paper):
    write(paper / "main.tex", "\\input{chapters/one}\n")
    write(paper / "chapters/one.tex", "ONE\n\\input{two}\n")  # two.tex sits next to one.tex
    write(paper / "chapters/two.tex", "TWO\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "ONE" in result.text and "TWO" in result.text
    assert result.problems == []


def test_inlined_text_replaces_the_command_in_place(paper):
    write(paper / "main.tex", "before \\input{x} after\n")
    write(paper / "x.tex", "INSIDE\n")
    assert flatten_latex(Tree.of(str(paper)), "main.tex").text == "before INSIDE after\n"


def test_commented_out_input_is_not_inlined(paper):
    write(paper / "main.tex", "A\n% \\input{secret}\nB %\\input{secret}\n")
    write(paper / "secret.tex", "SECRET\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "SECRET" not in result.text
    assert result.problems == [] and result.included == []


def test_input_inside_verbatim_is_not_inlined(paper):
    write(paper / "main.tex", "\\begin{verbatim}\n\\input{secret}\n\\end{verbatim}\n")
    write(paper / "secret.tex", "SECRET\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "\\input{secret}" in result.text and "SECRET" not in result.text


def test_verbatim_in_an_included_file_is_kept(paper):
    write(paper / "main.tex", "\\input{code}\n")
    write(paper / "code.tex", "\\begin{verbatim}\n% kept\n\\end{verbatim}\n")
    assert "% kept" in flatten_latex(Tree.of(str(paper)), "main.tex").text


def test_cycle_between_two_files_is_recorded_once_and_not_followed(paper):
    write(paper / "main.tex", "\\input{a}\n")
    write(paper / "a.tex", "A-BODY\n\\input{b}\n")
    write(paper / "b.tex", "B-BODY\n\\input{a}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert result.text.count("A-BODY") == 1 and result.text.count("B-BODY") == 1
    assert kinds(result) == ["include_cycle"]
    assert result.problems[0]["path"] == "a"


def test_self_include_is_a_cycle(paper):
    write(paper / "main.tex", "SELF\n\\input{main}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert result.text.count("SELF") == 1
    assert kinds(result) == ["include_cycle"]


def test_same_file_twice_without_recursion_is_not_a_cycle(paper):
    write(paper / "main.tex", "\\input{macros}\n\\input{macros}\n")
    write(paper / "macros.tex", "MACROS\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert result.text.count("MACROS") == 2
    assert result.problems == []


def test_missing_include_is_recorded_and_left_as_written(paper):
    write(paper / "main.tex", "\\input{Version.tex}\n\\include{nothere}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert kinds(result) == ["missing_include", "missing_include"]
    assert [p["path"] for p in result.problems] == ["Version.tex", "nothere"]
    assert "\\input{Version.tex}" in result.text and "\\include{nothere}" in result.text


def test_parent_directory_escape_is_refused(tmp_path, paper):
    write(tmp_path / "outside.tex", "OUTSIDE-SECRET\n")
    write(paper / "main.tex", "\\input{../outside}\n\\input{../../outside.tex}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "OUTSIDE-SECRET" not in result.text
    assert kinds(result) == ["include_outside", "include_outside"]


def test_absolute_path_is_refused_even_when_it_exists(tmp_path, paper):
    secret = write(tmp_path / "outside.tex", "OUTSIDE-SECRET\n")
    inside = write(paper / "inside.tex", "INSIDE-ABS\n")
    write(paper / "main.tex", f"\\input{{{secret}}}\n\\input{{{inside}}}\n\\input{{/etc/passwd}}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "OUTSIDE-SECRET" not in result.text and "INSIDE-ABS" not in result.text
    assert "root:" not in result.text
    assert kinds(result) == ["include_outside"] * 3


def test_symlink_to_a_file_outside_is_refused(tmp_path, paper):
    secret = write(tmp_path / "outside.tex", "OUTSIDE-SECRET\n")
    os.symlink(secret, paper / "link.tex")
    (tmp_path / "outdir").mkdir()
    write(tmp_path / "outdir" / "x.tex", "OUTDIR-SECRET\n")
    os.symlink(tmp_path / "outdir", paper / "linkdir")
    write(paper / "main.tex", "\\input{link}\n\\input{linkdir/x}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "OUTSIDE-SECRET" not in result.text and "OUTDIR-SECRET" not in result.text
    assert kinds(result) == ["include_outside", "include_outside"]


def test_symlink_inside_the_paper_is_followed(paper):
    write(paper / "real/part.tex", "PART\n")
    os.symlink(paper / "real" / "part.tex", paper / "alias.tex")
    write(paper / "main.tex", "\\input{alias}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "PART" in result.text and result.problems == []


def test_escape_that_comes_back_inside_is_allowed(paper):
    write(paper / "sub/x.tex", "X-CONTENT\n")
    write(paper / "main.tex", f"\\input{{../{paper.name}/sub/x}}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "X-CONTENT" in result.text and result.problems == []


def test_include_depth_limit(paper):
    for level in range(40):
        write(paper / f"f{level}.tex", f"LEVEL-{level}-\n\\input{{f{level + 1}}}\n")
    write(paper / "main.tex", "\\input{f0}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex", max_depth=5)
    assert "LEVEL-4-" in result.text  # f4 sits at depth 5 (main is depth 0)
    assert "LEVEL-5-" not in result.text
    assert kinds(result) == ["include_too_deep"]
    assert result.problems[0]["path"] == "f5"


def test_default_depth_limit_stops_a_deep_chain(paper):
    for level in range(60):
        write(paper / f"f{level}.tex", f"LEVEL-{level}-\n\\input{{f{level + 1}}}\n")
    write(paper / "main.tex", "\\input{f0}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "LEVEL-0-" in result.text and "LEVEL-59-" not in result.text
    assert kinds(result) == ["include_too_deep"]


def test_include_count_limit_stops_exponential_expansion(paper):
    for level in range(30):
        write(paper / f"g{level}.tex", f"\\input{{g{level + 1}}}\\input{{g{level + 1}}}\n")
    write(paper / "g30.tex", "LEAF\n")
    write(paper / "main.tex", "\\input{g0}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex", max_includes=50)
    assert len(result.included) == 50
    assert set(kinds(result)) == {"too_many_includes"}


@pytest.mark.parametrize("content", [b"caf\xe9 au lait\n", b"\x00\x01\x02binary"])
def test_unreadable_include_is_recorded(paper, content):
    write(paper / "bad.tex", content)
    write(paper / "main.tex", "BEFORE\n\\input{bad}\nAFTER\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert "BEFORE" in result.text and "AFTER" in result.text
    assert kinds(result) == ["include_unreadable"]


def test_empty_include_is_fine(paper):
    write(paper / "empty.tex", "")
    write(paper / "main.tex", "A\n\\input{empty}\nB\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert result.problems == [] and result.included == ["empty.tex"]


def test_unreadable_main_file_raises(paper):
    write(paper / "main.tex", b"\xff\xfe\x00\x00")
    with pytest.raises(UnreadableInput):
        flatten_latex(Tree.of(str(paper)), "main.tex")


def test_problems_have_uniform_string_fields(tmp_path, paper):
    write(paper / "main.tex", "\\input{missing}\n\\input{/abs}\n\\input{main}\n")
    result = flatten_latex(Tree.of(str(paper)), "main.tex")
    assert len(result.problems) == 3
    for problem in result.problems:
        assert set(problem) == {"kind", "path", "detail"}
        assert all(isinstance(value, str) and value for value in problem.values())


# --------------------------------------------------------------------------------------------
# Main file
# --------------------------------------------------------------------------------------------


def test_main_file_single_candidate(paper):
    write(paper / "chapter.tex", "Chapter text\n")
    write(paper / "thesis.tex", "\\documentclass{report}\n\\input{chapter}\n")
    choice = find_main_file(Tree.of(str(paper)))
    assert choice.path == "thesis.tex" and choice.reason == "only_candidate"


def test_main_file_preferred_name(paper):
    write(paper / "aaa.tex", "\\documentclass{article}\n")
    write(paper / "main.tex", "\\documentclass{article}\n")
    choice = find_main_file(Tree.of(str(paper)))
    assert choice.path == "main.tex" and choice.reason == "preferred_name"


def test_main_file_not_included_by_another(paper):
    # "chapter" sorts before "thesis", so only the inclusion rule can pick thesis.tex.
    write(paper / "chapter.tex", "\\documentclass{standalone}\nChapter\n")
    write(paper / "thesis.tex", "\\documentclass{report}\n\\input{chapter}\n")
    choice = find_main_file(Tree.of(str(paper)))
    assert choice.path == "thesis.tex" and choice.reason == "not_included"


def test_main_file_tie_broken_by_depth_then_path(paper):
    write(paper / "sub/aaa.tex", "\\documentclass{article}\n")
    write(paper / "zzz.tex", "\\documentclass{article}\n")
    write(paper / "yyy.tex", "\\documentclass{article}\n")
    choice = find_main_file(Tree.of(str(paper)))
    assert choice.path == "yyy.tex" and choice.reason == "first_by_path"


def test_main_file_ignores_commented_documentclass(paper):
    write(paper / "notes.tex", "% \\documentclass{article}\n")
    write(paper / "real.tex", "\\documentclass{article}\n")
    assert find_main_file(Tree.of(str(paper))).path == "real.tex"


def test_main_file_ignores_symlink_to_outside(tmp_path, paper):
    write(tmp_path / "elsewhere.tex", "\\documentclass{article}\n")
    os.symlink(tmp_path / "elsewhere.tex", paper / "main.tex")
    write(paper / "other.tex", "no class\n")
    assert find_main_file(Tree.of(str(paper))) is None


def test_no_main_file(paper):
    write(paper / "a.tex", "just a fragment\n")
    assert find_main_file(Tree.of(str(paper))) is None


def _scan_code_line_reference(line: str):
    """The character-by-character scan (the definition): ``%`` starts a comment, a backslash
    consumes the next character unless it begins a verbatim environment or an inline verbatim."""
    from longctx.pipeline.readers import latex

    i = 0
    while i < len(line):
        if line[i] == "%":
            return i, None
        if line[i] == "\\":
            begin = latex._BEGIN_VERBATIM_RE.match(line, i)
            if begin:
                return None, begin
            inline = latex._INLINE_VERBATIM_RE.match(line, i)
            if inline:
                i = latex._skip_inline_verbatim(line, inline.end(), options=inline.group(1) == "lstinline")
                continue
            i += 2
            continue
        i += 1
    return None, None


def test_code_line_scan_equals_the_character_by_character_definition():
    """The scan that jumps from one ``%`` or backslash to the next, against the plain loop, on
    random lines dense in comments, escapes and inline and environment verbatim."""
    import random

    from longctx.pipeline.readers.latex import _scan_code_line

    parts = [
        "%",
        "\\",
        "\\\\",
        "\\%",
        "\\verb|a%b|",
        "\\verb*+x+",
        "\\verb",
        "\\lstinline[x]{q%}",
        "\\lstinline",
        "\\begin{verbatim}",
        "\\begin {lstlisting}",
        "\\begin{itemize}",
        "{",
        "}",
        "[",
        "]",
        "|",
        "+",
        "a",
        " ",
        "é",
    ]
    rng = random.Random(0)
    for _ in range(20000):
        line = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        ours, ref = _scan_code_line(line), _scan_code_line_reference(line)
        assert ours[0] == ref[0] and (ours[1] and ours[1].span()) == (ref[1] and ref[1].span()), line
