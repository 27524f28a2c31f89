"""The results file: sections between markers, and the claims overview gathered from them."""

from hashlearn.experiments._common import claims_overview, write_section
from hashlearn.experiments.pipeline import claim, write_claims


def _claims_section(tmp_path, name, rows):
    return f"## {name}\n\n### Claims\n\n" + write_claims(tmp_path, rows) + "\n\nmore text\n"


def test_sections_are_replaced_in_place_and_the_overview_goes_first(tmp_path):
    path = tmp_path / "results.md"
    path.write_text(
        "# Measured results\n\nIntro.\n\n<!-- bench:start -->\nold\n<!-- bench:end -->\n"
    )
    write_section(path, "bench", "new timing table")
    text = path.read_text()
    assert "old" not in text and "new timing table" in text
    assert "## Claims" not in text  # no section holds claims yet

    held = claim("Paper A", "method beats LSH", "digits", [0.05, 0.04, 0.06], baseline="LSH")
    failed = claim("Paper A", "method beats SH", "fashion", [-0.01, -0.02, -0.015])
    write_section(path, "reproduce-a", _claims_section(tmp_path, "a", [held, failed]))
    text = path.read_text()
    assert text.index("<!-- claims:start -->") < text.index("<!-- bench:start -->")
    overview = text.split("<!-- claims:start -->")[1].split("<!-- claims:end -->")[0]
    assert "1 hold, 1 fail, 0 tie, of 2." in overview
    assert (
        "| Paper A | method beats SH | fashion | fails | -0.015 | [-0.027, -0.003] | 3 | - "
        "| reproduce-a |  |" in overview
    )

    # An ablation's finding is attached to the claim it explains; rewriting keeps one overview.
    findings = "## Ablations\n\n| claim | data | finding |\n|---|---|---|\n"
    findings += "| method beats SH | fashion | data: too few labels |\n"
    write_section(path, "ablations", findings)
    text = path.read_text()
    assert text.count("<!-- claims:start -->") == 1
    assert "| reproduce-a | data: too few labels |" in text
    assert (
        "| Paper A | method beats LSH | digits | holds | +0.050 | [+0.025, +0.075] | 3 | LSH |"
        in text
    )


def test_overview_keeps_rows_written_before_the_intervals_marked_as_such():
    text = (
        "<!-- old:start -->\n| paper | claim | data | result | margin | seeds |\n"
        "|---|---|---|---|---|---|\n| P | a | d | holds | +0.002 | 10 |\n<!-- old:end -->\n"
    )
    overview = claims_overview(text)
    assert "0 hold, 0 fail, 0 tie, of 1. 1 rows come from runs made before" in overview
    assert (
        "| P | a | d | holds (sign only, no interval) | +0.002 | not computed (run before the "
        "intervals) | 10 | not recorded | old |" in overview
    )


def test_overview_ignores_other_tables_and_its_own_rows():
    text = (
        "<!-- claims:start -->\n| paper | claim | data | result | margin | seeds |\n"
        "|---|---|---|---|---|---|\n| P | stale | d | holds | +1.000 | 1 |\n<!-- claims:end -->\n"
        "<!-- x:start -->\n| method | 8 bits |\n|---|---|\n| LSH | 0.5 |\n<!-- x:end -->\n"
    )
    assert claims_overview(text) == ""
