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

    held = claim("Paper A", "method beats LSH", "digits", 0.05, 10)
    failed = claim("Paper A", "method beats SH", "fashion", -0.01, 3)
    write_section(path, "reproduce-a", _claims_section(tmp_path, "a", [held, failed]))
    text = path.read_text()
    assert text.index("<!-- claims:start -->") < text.index("<!-- bench:start -->")
    overview = text.split("<!-- claims:start -->")[1].split("<!-- claims:end -->")[0]
    assert "(1 of 2 hold)" in overview
    assert (
        "| Paper A | method beats SH | fashion | does not hold | -0.010 | 3 | reproduce-a |  |"
        in (overview)
    )

    # An ablation's finding is attached to the claim it explains; rewriting keeps one overview.
    findings = "## Ablations\n\n| claim | data | finding |\n|---|---|---|\n"
    findings += "| method beats SH | fashion | data: too few labels |\n"
    write_section(path, "ablations", findings)
    text = path.read_text()
    assert text.count("<!-- claims:start -->") == 1
    assert "| reproduce-a | data: too few labels |" in text
    assert "| Paper A | method beats LSH | digits | holds | +0.050 | 10 | reproduce-a |  |" in text


def test_overview_ignores_other_tables_and_its_own_rows():
    text = (
        "<!-- claims:start -->\n| paper | claim | data | result | margin | seeds |\n"
        "|---|---|---|---|---|---|\n| P | stale | d | holds | +1.000 | 1 |\n<!-- claims:end -->\n"
        "<!-- x:start -->\n| method | 8 bits |\n|---|---|\n| LSH | 0.5 |\n<!-- x:end -->\n"
    )
    assert claims_overview(text) == ""
