"""The pixel bench's measurements: emulator rates counted in emulator frames, bytes on the wire."""

from __future__ import annotations

import os
import time

import pytest

from distributed.bench import pixel_ceiling, pixels

pytest.importorskip("ale_py", reason="the pixel bench needs ale-py: pip install -e '.[atari]'")
pytest.importorskip("cv2", reason="the pixel bench needs opencv: pip install -e '.[atari]'")


@pytest.mark.parametrize("measure", [pixels.raw_rate, pixels.preprocessed_rate])
def test_rates_count_emulator_frames(measure):
    rate = measure(seconds=0.2)
    assert rate.agent_steps >= 64 and rate.agent_steps % 64 == 0
    assert rate.frames == 4 * rate.agent_steps
    assert rate.frames_per_s == pytest.approx(rate.frames / rate.wall_s)
    assert rate.wall_s >= 0.2 and rate.cpu_s > 0
    assert set(rate.to_dict()) >= {"frames", "frames_per_s", "frames_per_cpu_s"}


def test_wire_bytes_of_stacked_pong_frames():
    sizes = pixels.wire_bytes(batch=4, segment_length=8)
    assert sizes.obs_bytes == 4 * 84 * 84 and sizes.new_frame_bytes == 84 * 84
    # each message carries every observation whole, plus a small header and the other fields
    assert sizes.obs_bytes < sizes.inference_per_obs < sizes.obs_bytes + 200
    bootstrap_share = sizes.obs_bytes * 9 / 8  # 9 steps travel for 8 trained ones
    assert bootstrap_share < sizes.samples_per_step < bootstrap_share + 200


def test_shared_memory_saves_the_kernel_copies_of_every_observation():
    from distributed.bench.pixel_suite import copied_bytes_per_frame

    copies = copied_bytes_per_frame(batch=4, segment_length=8)
    obs, frame_skip = 4 * 84 * 84, 4
    # sockets copy each request and chunk into and out of the kernel, and the trainer once
    # more; shared memory writes each once: about 2 x obs a step fewer, and never more
    saved = (copies["socket"] - copies["shm"]) * frame_skip
    assert 1.9 * obs < saved < 2.6 * obs, saved


def test_parallel_rate_steps_every_process_over_one_window():
    rate = pixel_ceiling.parallel_rate("preprocessed", 2, 0.3, envs=3, env_args={"frame_skip": 2})
    assert rate.processes == 2 and rate.envs_per_process == 3
    for one in rate.rates:  # the run's frame skip is what frames are counted in
        assert one.frame_skip == 2 and one.frames == 2 * one.agent_steps
        assert 0.3 <= one.wall_s < 5.0 and one.agent_steps >= 64
    assert rate.frames_per_s == pytest.approx(sum(r.frames_per_s for r in rate.rates))
    frames, cpu = sum(r.frames for r in rate.rates), sum(r.cpu_s for r in rate.rates)
    assert rate.cpu_us_per_frame == pytest.approx(1e6 * cpu / frames)
    assert rate.to_dict()["per_process_frames_per_s"] == [round(r.frames_per_s) for r in rate.rates]


def test_a_loop_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match=r"did not start.*unexpected keyword argument 'bogus'"):
        pixel_ceiling.parallel_rate("preprocessed", 2, 0.3, env_args={"bogus": 1})
    with pytest.raises(ValueError, match="'raw' or 'preprocessed'"):
        pixel_ceiling.parallel_rate("cartpole", 1, 0.3)


def test_the_environment_ceiling_follows_the_runs_actor_layout():
    from distributed.bench.pixel_suite import actor_layout

    envs, args = actor_layout(["actors.envs_per_worker=4", "environment.args.noop_max=7"])
    assert envs == 4 and args["game"] == "Pong" and args["noop_max"] == 7


def test_the_pixels_suite_measures_atari_experiments_only():
    from api.errors import UserError
    from distributed.bench.pixel_suite import actor_layout

    envs, args = actor_layout([], "pong-ppo-gpu")  # the GPU recipe, as it ships
    assert envs == 16 and args["game"] == "Pong"
    with pytest.raises(UserError, match="measures Atari experiments; 'cartpole-ppo' steps"):
        actor_layout([], "cartpole-ppo")


def test_gpu_samples_are_summarised_and_their_absence_said():
    from distributed.bench.gpu_use import GpuSampler, summarize
    from distributed.bench.pixel_suite import gpu_row

    text = "31, 20000\n45, 21000\n[N/A], [N/A]\n"
    gpu = summarize(text)
    assert gpu == {"utilisation_mean": 38.0, "utilisation_max": 45.0, "memory_peak_mib": 21000.0,
                   "samples": 2}  # fmt: skip
    assert gpu_row(gpu) == "38%, 45%; 21,000 MiB"
    assert summarize("") is None and summarize("garbage\n") is None
    assert gpu_row(None).startswith("no GPU")
    assert GpuSampler().stop() is None  # never started: nothing sampled, nothing to stop


def test_the_trainer_row_gives_step_time_and_graphs_by_policy():
    from distributed.bench.pixel_suite import trainer_figures, trainer_row

    records = [
        {"trainer/default/step_s": 0.2, "trainer/default/minibatch_graphs": 0.0, "fps": 1.0},
        {"trainer/default/step_s": 0.3, "trainer/default/minibatch_graphs": 1.0},
        {"trainer/other/step_s": 0.5, "timing/trainer/busy": 1.0},
    ]
    figures = trainer_figures(records)
    assert figures == {"default/step_s": pytest.approx(0.25), "default/minibatch_graphs": 1.0,
                       "other/step_s": 0.5}  # fmt: skip
    assert trainer_row(figures) == "default 0.250 s, 1 graph; other 0.500 s"
    assert trainer_row({}) == "-"


def test_the_gpu_sampler_reads_nvidia_smi_until_stopped(tmp_path, monkeypatch):
    # a stand-in printing what `nvidia-smi --query-gpu=... -lms N` prints, once a period, as
    # long as it runs: what is checked is the sampler's process handling and parsing
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nwhile true; do echo '50, 1000'; sleep 0.05; done\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    from distributed.bench.gpu_use import GpuSampler

    sampler = GpuSampler(period_ms=50).start()
    time.sleep(0.5)
    gpu = sampler.stop()
    assert gpu["utilisation_mean"] == 50.0 and gpu["memory_peak_mib"] == 1000.0
    assert gpu["samples"] >= 3 and sampler.stop() is None


def test_a_loop_that_never_gets_ready_is_given_up(monkeypatch):
    import subprocess
    import sys

    monkeypatch.setattr(pixel_ceiling, "START_TIMEOUT_S", 0.5)
    silent = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start"):
        pixel_ceiling._in_step([silent], "raw", 0.3)
    assert time.monotonic() - started < 10 and silent.poll() is not None  # killed, not waited
