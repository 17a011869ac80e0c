"""Output files (planner.outputs and the CLI's -o/--plot): symlinks, special files, existing files,
read-only folders, full disks. Every case is refused in one line with exit 2, before any search, and
leaves no temporary file behind."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from planner.core.errors import InputError
from planner.outputs import check_output, plot_formats, write_output
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
PLAN = ["plan", MLP, "--dim", "batch=8"]  # the default answer: the launchable search
PER_OP = [*PLAN, "--target", "generic", "--method", "dp"]  # the per-op frontier (--plot draws it)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def no_search(monkeypatch):
    """Fail the test if the CLI starts a search: every output is checked before it."""
    import planner.launchable as launchable_module
    import planner.plan as plan_module

    def refuse(*args, **kwargs):
        raise AssertionError("searched before checking the outputs")

    monkeypatch.setattr(plan_module, "plan", refuse)
    monkeypatch.setattr(launchable_module, "plan_launchable_file", refuse)
    monkeypatch.setattr(launchable_module, "launch_frontier", refuse)


class TestWriteOutput:
    def test_writes_atomically_with_umask_mode(self, tmp_path):
        target = tmp_path / "plan.json"
        write_output(target, "x" * 1000, force=False)
        assert target.read_text() == "x" * 1000
        mask = os.umask(0)
        os.umask(mask)
        assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
        assert names(tmp_path) == ["plan.json"]

    def test_existing_file_needs_force(self, tmp_path):
        target = tmp_path / "plan.json"
        target.write_text("mine")
        with pytest.raises(InputError, match="--force"):
            write_output(target, "new", force=False)
        assert target.read_text() == "mine"
        write_output(target, "new", force=True)
        assert target.read_text() == "new"
        assert names(tmp_path) == ["plan.json"]

    @pytest.mark.parametrize("force", [False, True])
    def test_symlink_is_never_followed(self, tmp_path, force):
        victim = tmp_path / "victim.txt"
        victim.write_text("precious")
        link = tmp_path / "plan.json"
        link.symlink_to(victim)
        with pytest.raises(InputError, match="symbolic link"):
            write_output(link, "evil", force=force)
        assert victim.read_text() == "precious" and link.is_symlink()

    def test_dangling_symlink_is_refused(self, tmp_path):
        link = tmp_path / "plan.json"
        link.symlink_to(tmp_path / "nowhere" / "file")
        with pytest.raises(InputError, match="symbolic link"):
            write_output(link, "x", force=True)
        assert link.is_symlink() and not (tmp_path / "nowhere").exists()

    def test_directory_and_fifo_refused_even_with_force(self, tmp_path):
        folder = tmp_path / "out"
        folder.mkdir()
        with pytest.raises(InputError, match="a folder, not a regular file"):
            write_output(folder, "x", force=True)
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        with pytest.raises(InputError, match="a FIFO, not a regular file"):
            write_output(fifo, "x", force=True)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)

    def test_device_node_refused_even_with_force(self):
        with pytest.raises(InputError, match="a device, not a regular file"):
            check_output(Path("/dev/null"), force=True)

    def test_missing_folder(self, tmp_path):
        with pytest.raises(InputError, match="does not exist"):
            write_output(tmp_path / "no" / "plan.json", "x", force=False)

    def test_temporary_name_is_unpredictable_and_removed_on_failure(self, tmp_path, monkeypatch):
        # a planted ".plan.json.tmp" (the old fixed name) is neither used nor touched
        planted = tmp_path / ".plan.json.tmp"
        planted.write_text("planted")
        seen = []

        def failing_writer(temporary: Path) -> None:
            seen.append(temporary)
            raise OSError(28, "No space left on device")

        from planner.outputs import write_output_with

        with pytest.raises(InputError, match="No space left on device"):
            write_output_with(tmp_path / "plan.json", failing_writer, force=False)
        assert seen[0] != planted and seen[0].parent == tmp_path
        assert names(tmp_path) == [".plan.json.tmp"] and planted.read_text() == "planted"

    def test_file_size_limit_is_one_line_and_leaves_nothing(self, tmp_path):
        """A full disk, simulated with RLIMIT_FSIZE (Python ignores SIGXFSZ, so write() gets EFBIG)."""
        code = (
            "import sys; from pathlib import Path; from planner.outputs import write_output\n"
            "from planner.core.errors import InputError\n"
            "try:\n"
            f"    write_output(Path({str(tmp_path / 'plan.json')!r}), 'x' * 100000, force=False)\n"
            "except InputError as e:\n"
            "    print(e); sys.exit(2)\n"
        )

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit,
                              cwd=ROOT, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "File too large" in done.stdout and len(done.stdout.strip().splitlines()) == 1
        assert names(tmp_path) == []

    @pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
    def test_read_only_folder(self, tmp_path):
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        try:
            with pytest.raises(InputError, match="not writable"):
                write_output(folder / "plan.json", "x", force=False)
        finally:
            folder.chmod(0o700)

    def test_read_only_file_system(self, tmp_path, monkeypatch):
        """mkstemp failing (EROFS: the check passed, as it does for root or a read-only mount)."""
        import errno
        import tempfile

        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(tempfile, "mkstemp", read_only)
        with pytest.raises(InputError, match=r"cannot write .*plan.json \(Read-only file system\)"):
            write_output(tmp_path / "plan.json", "x", force=False)
        assert names(tmp_path) == []

    def test_plot_formats_come_from_matplotlib(self):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        assert set(plot_formats()) == set(FigureCanvasAgg.get_supported_filetypes())
        assert "png" in plot_formats() and "xyz" not in plot_formats()


class TestCliOutputs:
    @pytest.mark.parametrize(
        "extra, needle",
        [
            (["--plot", "PLOT/x.xyz"], "cannot write a '.xyz' image"),
            (["--plot", "PLOT/nodir/x.png"], "does not exist"),
            (["--plot", "PLOT/existing.png"], "existing.png exists; pass --force"),
            (["--plot", "PLOT/link.png", "--force"], "symbolic link"),
            (["-o", "PLOT/dangling.json"], "symbolic link"),
            (["-o", "PLOT/dangling.json", "--force"], "symbolic link"),
            (["-o", "/dev/null", "--force"], "a device, not a regular file"),
            (["-o", "PLOT", "--force"], "a folder, not a regular file"),
        ],
    )
    def test_refused_before_search_in_one_line(self, tmp_path, no_search, extra, needle):
        (tmp_path / "existing.png").write_bytes(b"mine")
        (tmp_path / "link.png").symlink_to(tmp_path / "existing.png")
        (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
        args = [str(a).replace("PLOT", str(tmp_path)) for a in extra]
        before = names(tmp_path)
        for base in ([PER_OP] if "--plot" in extra else [PLAN, PER_OP]):
            result = run_cli([*base, *args], 2)
            assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert names(tmp_path) == before
            assert (tmp_path / "existing.png").read_bytes() == b"mine"

    def test_plot_with_force_replaces_and_other_formats_work(self, tmp_path):
        svg = tmp_path / "frontier.svg"
        svg.write_text("old")
        run_cli([*PER_OP, "-n", "2", "--plot", svg, "--force", "-q"])
        assert svg.read_text().lstrip().startswith("<?xml") and names(tmp_path) == ["frontier.svg"]

    def test_export_command_checks_output_first(self, tmp_path, monkeypatch):
        import planner.export as export_module

        def refuse(*args, **kwargs):
            raise AssertionError("exported before checking -o")

        monkeypatch.setattr(export_module, "export_saved_plan", refuse)
        link = tmp_path / "out.json"
        link.symlink_to(tmp_path / "elsewhere.json")
        result = run_cli(["export", tmp_path / "plan.json", "-o", link, "--force"], 2)
        assert "symbolic link" in result.stderr and not (tmp_path / "elsewhere.json").exists()


FULL_DISK = "error: cannot write output: No space left on device; free some space, or send stdout to another file system"


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory) -> Path:
    plan = tmp_path_factory.mktemp("full") / "plan.json"
    run_cli([*PLAN, "-n", "2", "--pick", "1", "-o", plan, "-q"])
    return plan


def planner_process(args: list, stdout: int, **options) -> subprocess.CompletedProcess:
    """``planner ARGS`` in its own process (stdout a real file descriptor), stderr captured."""
    command = [sys.executable, "-c", "from planner.cli import main; main()", *map(str, args)]
    return subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120, **options)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
class TestStdoutOnAFullDisk:
    """``planner ... > /dev/full``: every write fails with ENOSPC. One line naming it, exit 2; not
    "internal error" (exit 1), nor the interpreter's "Exception ignored" at exit (exit 120)."""

    @pytest.mark.parametrize("args", [
        [*PLAN, "-n", "2", "--json"],
        [*PLAN, "-n", "2"],
        [*PER_OP, "-n", "2", "--json"],
        ["export", "PLAN"],
        ["export", "PLAN", "--format", "deepspeed"],
        ["explain", "PLAN"],
        ["explain", "PLAN", "--json"],
        ["compare", "PLAN", "PLAN", "--json"],
        ["inspect", MLP, "--dim", "batch=8", "--json"],
        ["inspect", MLP, "--dim", "batch=8"],
        ["devices"],
        ["devices", "--json"],
    ], ids=lambda args: " ".join(map(str, args[:4])).replace(str(MLP), "mlp.onnx"))  # fmt: skip
    def test_one_line_exit_2(self, saved_plan, args):
        args = [saved_plan if a == "PLAN" else a for a in args]
        with open("/dev/full", "w") as full:
            done = planner_process([*args, "-q"] if args[0] == "plan" else args, full)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [FULL_DISK]

    def test_export_to_stdout_from_plan(self, tmp_path):
        """``plan --target deepspeed --pick 1 --export deepspeed`` with no ``-o`` prints the table, then the plan."""
        with open("/dev/full", "w") as full:
            # -q: a loaded machine's progress lines ("[2 s] pipeline search") would sit before the one line
            done = planner_process([*PLAN, "-n", "2", "--target", "deepspeed", "--pick", "1", "--export", "deepspeed", "-q"],
                                   full)
        assert done.returncode == 2 and done.stderr.splitlines() == [FULL_DISK]


class TestStdoutClosed:
    def test_reader_gone_is_quiet_exit_2(self, saved_plan):
        """``planner ... | head -1`` once head has exited: the pipe has no reader (EPIPE; Python ignores
        SIGPIPE). Nothing to tell the reader that left: no message, exit 2."""
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = planner_process(["explain", saved_plan, "--json"], write_end)
        finally:
            os.close(write_end)
        assert done.returncode == 2 and done.stderr == ""

    def test_in_process_console_keeps_nothing_after_a_failed_write(self, monkeypatch):
        """A failed write raises OutputError and drops what the console held, so that a later print in
        the same process does not repeat it."""
        import errno
        import io

        from planner import render

        class Full(io.StringIO):
            def write(self, text):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(sys, "stdout", Full())
        with pytest.raises(render.OutputError, match="cannot write output: No space left on device"):
            render.stdout.print("lost")
        with pytest.raises(render.OutputError, match="No space left"):
            render.print_json({"a": 1})
        kept = io.StringIO()
        monkeypatch.setattr(sys, "stdout", kept)
        render.stdout.print("next")
        assert kept.getvalue() == "next\n"
