"""Issue 31, finding 5: memopt's runtime folder (`$TMPDIR/memopt-<uid>`: worker sockets, locks and
logs, GPU lease files) has a predictable path, so another local user could create it first. A
folder memopt did not make private, or a link planted in it, must stop the job before anything is
written, and nothing outside the folder may ever be written."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from memopt.errors import MemoptError
from memopt.run import worker
from memopt.runtime import lease
from memopt.runtime.private_dir import RUNTIME_ENV, runtime_dir

ON = {"enabled": True, "idle_s": 30}


@pytest.fixture
def temp(tmp_path, monkeypatch):
    """A temp dir of our own (TMPDIR) and a victim file outside memopt's folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv(RUNTIME_ENV, raising=False)
    monkeypatch.delenv(lease.LOCK_DIR_ENV, raising=False)
    (tmp_path / "tmp").mkdir()
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    return tmp_path / "tmp" / f"memopt-{os.getuid()}", victim


def untouched(victim: Path) -> bool:
    return victim.read_text() == "precious\n" and os.listdir(victim.parent) == [victim.name]


def test_a_fresh_runtime_folder_is_private(temp):
    folder, _ = temp
    assert runtime_dir() == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
    assert runtime_dir() == folder  # and accepted the next time


def test_the_worker_refuses_a_folder_open_to_others(
    temp, tiny_study, tmp_path, monkeypatch, capsys
):
    folder, victim = temp
    folder.mkdir()
    folder.chmod(0o777)  # as another user would leave it for us
    monkeypatch.chdir(tmp_path)
    cfg, _ = tiny_study
    (folder / "planted.log").symlink_to(victim)
    args = dict(cfg=cfg, function="fp32", seed=1, tokens_dir=str(tmp_path), out="q.json")
    with pytest.raises(SystemExit) as exit_:
        worker.run_job(ON, "quality_file", args, tmp_path / "q.log")
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"memopt's runtime folder {folder} is open to other users (mode 777" in err
    assert f"set {RUNTIME_ENV}" in err and "Traceback" not in err
    assert untouched(victim) and not (tmp_path / "q.json").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder another user's needs root")
def test_a_folder_of_another_user_is_refused(temp):
    folder, victim = temp
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)  # nobody
    with pytest.raises(MemoptError, match="belongs to user id 65534, not to you"):
        runtime_dir()
    with pytest.raises(MemoptError, match="belongs to user id 65534"):
        worker.socket_path()
    assert untouched(victim)


def test_a_folder_that_is_a_link_is_refused(temp, tmp_path, monkeypatch):
    folder, victim = temp
    monkeypatch.setenv(lease.FAKE_ENV, "gpu0")
    evil = tmp_path / "evil"
    evil.mkdir(mode=0o700)
    folder.symlink_to(evil)
    with pytest.raises(MemoptError, match=f"is a symbolic link \\(to {evil}\\)"):
        runtime_dir()
    with pytest.raises(MemoptError, match="symbolic link"), lease.gpu_lease():
        pass
    assert os.listdir(evil) == [] and untouched(victim)


def test_a_link_planted_for_the_worker_log_is_not_followed(
    temp, tiny_study, tmp_path, monkeypatch, capsys
):
    """The hash in the log's name is predictable from the working directory: the issue's
    reproduction overwrote a root-owned file with a worker log this way."""
    folder, victim = temp
    monkeypatch.chdir(tmp_path)
    planted = worker.socket_path().with_suffix(".log")  # creates the (private) folder
    planted.symlink_to(victim)
    cfg, _ = tiny_study
    args = dict(cfg=cfg, function="fp32", seed=1, tokens_dir=str(tmp_path), out="q.json")
    with pytest.raises(SystemExit):
        worker.run_job(ON, "quality_file", args, tmp_path / "q.log")
    err = capsys.readouterr().err
    assert f"{planted} is a symbolic link: memopt does not follow links" in err
    assert untouched(victim) and planted.is_symlink()


def test_a_link_planted_for_a_gpu_lock_is_not_followed(temp, monkeypatch):
    folder, victim = temp
    monkeypatch.setenv(lease.FAKE_ENV, "gpu0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (runtime_dir() / "gpus").mkdir(mode=0o700)
    (folder / "gpus" / "gpu0.lock").symlink_to(victim)
    with pytest.raises(MemoptError, match="gpu0.lock is a symbolic link"), lease.gpu_lease():
        pass
    assert untouched(victim)
    # A lock folder named by MEMOPT_GPU_LOCK_DIR gets the same check, and the message names it.
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(victim.parent))
    victim.parent.chmod(0o755)
    with pytest.raises(MemoptError, match="open to other users \\(mode 755.*MEMOPT_GPU_LOCK_DIR"):
        lease.lock_dir()


def test_the_gpus_folder_an_earlier_memopt_left_open_is_closed(temp, monkeypatch):
    """memopt made `gpus/` with mode 755 before it checked its folders: inside the checked
    runtime folder (which nobody else can write) it is made private, not refused."""
    folder, _ = temp
    monkeypatch.setenv(lease.FAKE_ENV, "gpu0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (runtime_dir() / "gpus").mkdir(mode=0o755)
    (folder / "gpus").chmod(0o755)
    with lease.gpu_lease() as gpu:
        assert gpu.key == "gpu0"
    assert stat.S_IMODE((folder / "gpus").stat().st_mode) == 0o700
