"""tuning.utils.cli_flags: a fire script's unknown flags found before it runs, as fire would read its flags."""

import pytest

from tuning.utils.cli_flags import reject_unknown_flags, unknown_flag


def sweep_like(spec: str, *inputs: str, point_timeout: float | None = None, dry_run: bool = False) -> None:
    """A fire entry point with a positional, a var-positional and two flags."""


@pytest.mark.parametrize(
    "argv",
    [
        ["spec.yaml", "--point_timeout", "5"],
        ["spec.yaml", "--point-timeout=5", "--dry_run"],
        ["--spec", "s.yaml", "--nodry_run", "-d"],  # fire's --no<flag> and its one-letter -d for --dry_run
        ["spec.yaml", "--point_timeout", "-1"],  # a negative number is a value, not a flag
        ["spec.yaml", "--", "--help"],  # after a bare --, fire's own flags
        ["spec.yaml", "--help"],
    ],
)
def test_flags_fire_reads_are_known(argv):
    assert unknown_flag(sweep_like, argv) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["s.yaml", "--point_timout", "5"], "unknown flag --point_timout; did you mean --point_timeout?"),
        (["s.yaml", "--dryrun"], "unknown flag --dryrun; did you mean --dry_run?"),
        (["s.yaml", "--zzz=1"], "unknown flag --zzz; valid flags: --spec, --point_timeout, --dry_run"),
    ],
)
def test_an_unknown_flag_names_the_closest_valid_one(argv, message):
    assert unknown_flag(sweep_like, argv) == message
    with pytest.raises(SystemExit) as exited:
        reject_unknown_flags(sweep_like, argv)
    assert exited.value.code == message  # SystemExit with a message: printed to stderr, exit status 1
