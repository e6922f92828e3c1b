"""The SSH link to a login node and the run folder mirrored through it, against OpenSSH's real server.

No Slurm here (tests/slurm/test_slurm_ssh.py trains over the link): what the remote side receives
(every word data, never code), the pinned host key, one shared connection, and the mirror that brings
back only what changed, so that a tick of a long run costs what it appended, not what it holds.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tunedeck.backend.runs import remote_folder
from tunedeck.backend.runs.ssh_link import SshLink, SshUnreachable
from tunedeck.tests.hostile.test_shell_payloads import DANGEROUS

pytestmark = [pytest.mark.integration]


def test_every_word_reaches_the_login_node_as_data(ssh_link, tmp_path):
    marker = tmp_path / "PWNED"
    words = [template.format(marker=marker) for template in DANGEROUS.values()]
    done = ssh_link.run(["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *words])
    assert json.loads(done.stdout) == words
    # A run folder and a file named by payloads: created with those very names, nothing run.
    folder = remote_folder.upload(ssh_link, _bundle(tmp_path), str(tmp_path / "runs" / words[0] / words[3]))
    assert folder == str(tmp_path / "runs" / words[0] / words[3])
    name = DANGEROUS["semicolon and comment"].format(marker="PWNED")  # a file name: no '/' in it
    remote_folder.put_file(ssh_link, folder, name, b"stop")
    assert sorted(p.name for p in (tmp_path / "runs" / words[0] / words[3]).iterdir()) == sorted(
        [name, "job.yaml", "logs"]
    )
    assert not marker.exists()


def test_a_host_key_not_pinned_is_refused_and_a_lost_server_is_unreachable(bare_login_node, ssh_link, tmp_path):
    node = bare_login_node
    ssh_link.close()  # a connection made with the pinned key would carry the next call without a new check
    stranger = tmp_path / "known_hosts"
    stranger.write_text("")  # StrictHostKeyChecking=yes: an unknown key is never accepted
    link = SshLink("127.0.0.1", node.user, node.port, str(node.user_key), str(stranger))
    with pytest.raises(SshUnreachable, match="Host key verification failed"):
        link.run(["true"])
    assert stranger.read_text() == ""  # and never written down

    ssh_link.run(["true"])
    node.cut()  # the server and its connections end, the shared one too
    try:
        with pytest.raises(SshUnreachable, match="Connection refused"):
            ssh_link.run(["true"])
    finally:
        node.restore()
    assert ssh_link.run(["echo", "back"]).stdout == b"back\n"  # a new shared connection, by itself


def test_every_call_shares_one_connection(ssh_link):
    ssh_link.run(["true"])
    check = subprocess.run(
        ["ssh", *ssh_link.options(), "-O", "check", "--", ssh_link.host], capture_output=True, text=True
    )
    assert check.returncode == 0 and "Master running" in check.stderr, check.stderr
    master = check.stderr.split("pid=")[1].split(")")[0]
    for _ in range(5):
        ssh_link.run(["true"])
    again = subprocess.run(
        ["ssh", *ssh_link.options(), "-O", "check", "--", ssh_link.host], capture_output=True, text=True
    )
    assert f"pid={master})" in again.stderr  # the same master carried all of them


def _bundle(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "logs").mkdir(parents=True, exist_ok=True)
    (bundle / "job.yaml").write_text("model: x\n")
    (bundle / "status.json").write_text("{}")  # kept here: never uploaded
    return bundle


def test_the_mirror_brings_what_changed_and_only_that(ssh_link, tmp_path):
    there = tmp_path / "there"
    folder = remote_folder.upload(ssh_link, _bundle(tmp_path), str(there))
    assert (there / "job.yaml").exists() and not (there / "status.json").exists()
    here = tmp_path / "here"
    here.mkdir()
    (here / "status.json").write_text('{"state": "running"}')

    metrics = there / "metrics.jsonl"
    metrics.write_text('{"event": "start"}\n')
    (there / "progress.json").write_text('{"step": 1}')
    (there / "output" / "checkpoint-5").mkdir(parents=True)
    (there / "output" / "checkpoint-5" / "model.safetensors").write_bytes(b"w" * 1000)
    (there / "output" / "model.safetensors").write_bytes(b"w" * (remote_folder.WHOLE_LIMIT + 1))
    (there / "leak").symlink_to("/etc/passwd")
    remote_folder.pull(ssh_link, folder, here)
    assert (here / "metrics.jsonl").read_text() == '{"event": "start"}\n'
    assert json.loads((here / "progress.json").read_text()) == {"step": 1}
    assert (here / "status.json").read_text() == '{"state": "running"}'  # the reader's own file stays
    assert not (here / "output").exists() and not (here / "leak").exists()  # weights stay there; links never come

    with metrics.open("a") as handle:
        handle.write('{"event": "log", "step": 1}\n')
    (there / "progress.json").write_text('{"step": 2}')
    (there / "job.yaml").unlink()
    came = remote_folder.pull(ssh_link, folder, here)
    assert came == len('{"event": "log", "step": 1}\n') + len('{"step": 2}')  # the appended line, the new file
    assert (here / "metrics.jsonl").read_text().splitlines()[-1] == '{"event": "log", "step": 1}'
    assert not (here / "job.yaml").exists()  # gone there, gone here
    assert remote_folder.pull(ssh_link, folder, here) == 0  # nothing changed, nothing came

    fetched = remote_folder.fetch(ssh_link, folder, here, "output/checkpoint-5")
    assert (fetched / "model.safetensors").read_bytes() == b"w" * 1000


def test_a_tick_of_a_long_run_costs_what_it_appended(ssh_link, tmp_path):
    """An hour of a run (3,600 steps logged, long rank logs) against its first minute: each tick brings the
    same bytes, and its time is measured side by side (printed; the bytes are what is asserted)."""
    there = tmp_path / "there"
    folder = remote_folder.upload(ssh_link, _bundle(tmp_path), str(there))
    line = json.dumps({"event": "log", "step": 0, "loss": 1.2345, "learning_rate": 2e-4, "tokens_per_s": 1234.5})

    def tick_cost(steps_before: int, here) -> tuple[float, int]:
        with (there / "metrics.jsonl").open("w") as handle:
            handle.write((line + "\n") * steps_before)
        (there / "logs" / "rank0.log").write_text("a rank's line of output\n" * steps_before * 5)
        remote_folder.pull(ssh_link, folder, here)  # the mirror is up to date
        times, sizes = [], []
        for _ in range(10):
            with (there / "metrics.jsonl").open("a") as handle:
                handle.write(line + "\n")
            with (there / "logs" / "rank0.log").open("a") as handle:
                handle.write("a rank's line of output\n" * 5)
            start = time.perf_counter()
            sizes.append(remote_folder.pull(ssh_link, folder, here))
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2], max(sizes)

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first_minute = tick_cost(60, tmp_path / "a")
    hour = tick_cost(3600, tmp_path / "b")
    assert first_minute[1] == hour[1] == len(line) + 1 + len("a rank's line of output\n") * 5
    print(
        f"per tick: {first_minute[0] * 1000:.0f} ms after a minute, {hour[0] * 1000:.0f} ms after an hour "
        f"({hour[0] / first_minute[0]:.2f}x), {hour[1]} bytes each"
    )
