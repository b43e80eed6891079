"""A trainer killed mid-epoch resumes from its checkpoint, input included: each example once per epoch.

    python examples/resume_training.py [--mode distributed_epoch|parallel_epochs] [--examples 4096]
        [--epochs 2] [--batch 32] [--checkpoint_every 10] [--kill_after_step 40] [--step_ms 10]
        [--restart_dispatcher] [--replace_workers]

It starts a fault-tolerant dispatcher and two workers as processes, runs the trainer below as a
process of its own, SIGKILLs it 0.3 s after its checkpoint at step --kill_after_step (the steps it
trains after that checkpoint are lost with it, as in a preemption), optionally restarts the
dispatcher or replaces the workers, and starts the trainer again: it restores model, optimizer and
input iterator from the checkpoint and trains to the end. From the trainers' step logs it then
checks that the steps the final model was trained on saw every example once per epoch
(parallel_epochs: once per worker per epoch, each worker's stream continuing where it was).

The trainer alone, against a running service:

    python examples/resume_training.py --trainer --service grpc://host:port --dir DIR
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LOG_NAME = "steps.log"


# ---- the trainer ------------------------------------------------------------------------------


def input_pipeline(args):
    """Examples with their ids, shuffled with a seed (deterministic given the splits), read from
    the service, repeated for the epochs and batched in the trainer."""
    import tensorflow as tf

    import dataservice

    def example(i):
        x = tf.stack([tf.cast(i % 7, tf.float32), tf.cast(i % 11, tf.float32), 1.0])
        y = 0.5 * x[0] - 0.25 * x[1] + 2.0
        return x, y, i

    source = tf.data.Dataset.range(args.examples).shuffle(256, seed=7).map(example)
    dataset = source.apply(dataservice.distribute(args.mode, args.service))
    return dataset.repeat(args.epochs).batch(args.batch)


def read_log(path: str) -> dict[int, list[int]]:
    """step -> the example ids of that step; a line cut short by a kill is left out."""
    steps: dict[int, list[int]] = {}
    if not os.path.exists(path):
        return steps
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                continue
            step, _, ids = line.partition(":")
            steps[int(step)] = [int(i) for i in ids.split()]
    return steps


def train(args) -> None:
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)  # its momentum variables exist before the restore
    step = tf.Variable(0, dtype=tf.int64)
    iterator = iter(input_pipeline(args))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator, step=step)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(args.dir, "checkpoints"), max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)
        print(f"restored step {int(step)} from {manager.latest_checkpoint}", flush=True)
    # The log keeps the steps the model has been trained on: those after the checkpoint were lost.
    log_path = os.path.join(args.dir, LOG_NAME)
    logged = read_log(log_path)
    kept = {s: ids for s, ids in logged.items() if s <= int(step)}
    if len(kept) < len(logged):
        print(f"{len(logged) - len(kept)} steps trained after that checkpoint are trained again", flush=True)
    with open(log_path, "w") as log:
        log.writelines(f"{s}: {' '.join(map(str, ids))}\n" for s, ids in sorted(kept.items()))

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x)[:, 0] - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    with open(log_path, "a") as log:
        for x, y, ids in iterator:
            loss = train_step(x, y)
            time.sleep(args.step_ms / 1000)  # the rest of a real model's step
            step.assign_add(1)
            log.write(f"{int(step)}: {' '.join(map(str, ids.numpy()))}\n")
            log.flush()
            if int(step) % args.checkpoint_every == 0:
                manager.save(checkpoint_number=int(step))
                print(f"checkpoint {int(step)} loss {float(loss):.4f}", flush=True)
    print(f"done at step {int(step)}", flush=True)


# ---- the run: cluster, kill, resume, check ------------------------------------------------------


def check(args, copies: int) -> list[str]:
    """Problems with the trained steps' examples; none when each epoch saw each example `copies` times."""
    steps = read_log(os.path.join(args.dir, LOG_NAME))
    if sorted(steps) != list(range(1, len(steps) + 1)):
        return [f"the logged steps are not 1..{len(steps)}"]
    seen = [i for s in sorted(steps) for i in steps[s]]
    per_epoch = args.examples * copies
    problems = []
    if len(seen) != per_epoch * args.epochs:
        problems.append(f"{len(seen)} examples trained on, expected {per_epoch * args.epochs}")
    for epoch in range(args.epochs):
        epoch_seen = seen[epoch * per_epoch : (epoch + 1) * per_epoch]
        counts = collections.Counter(epoch_seen)
        wrong = {i: c for i, c in counts.items() if c != copies}
        missing = args.examples - len(counts)
        if wrong or missing:
            problems.append(f"epoch {epoch}: {missing} examples missing, {len(wrong)} seen other than {copies}x")
            continue
        print(f"epoch {epoch}: each of {args.examples} examples seen {copies}x", flush=True)
        if copies == 2 and not in_order(epoch_seen):
            problems.append(f"epoch {epoch}: the workers' streams were not each in order")
        elif copies == 2:
            print(f"epoch {epoch}: each worker's stream in order", flush=True)
    return problems


def in_order(seen: list[int]) -> bool:
    """parallel_epochs, two workers: both streams yield the same order S (seeded shuffle), so the
    first occurrences follow S (the leading stream's position only grows) and so do the second
    ones (the trailing stream's): true when those two orders are one, as when each stream
    continued exactly where the checkpoint had left it."""
    firsts, seconds, met = [], [], set()
    for i in seen:
        (seconds if i in met else firsts).append(i)
        met.add(i)
    return firsts == seconds


def run_trainer(args, kill_after_step: int = 0) -> int:
    """Runs the trainer as a process; with kill_after_step, SIGKILLs it right after that checkpoint."""
    command = [sys.executable, os.path.abspath(__file__), "--trainer", f"--service={args.service}", f"--dir={args.dir}"]
    for name in ("mode", "examples", "epochs", "batch", "checkpoint_every", "step_ms"):
        command.append(f"--{name}={getattr(args, name)}")
    trainer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        for line in trainer.stdout:
            print("  trainer:", line.rstrip(), flush=True)
            if kill_after_step and line.startswith("checkpoint ") and int(line.split()[1]) >= kill_after_step:
                time.sleep(0.3)  # it trains on past the checkpoint: those steps die with it
                trainer.send_signal(signal.SIGKILL)
                print(f"  trainer SIGKILLed after its checkpoint at step {line.split()[1]}", flush=True)
                break
        return trainer.wait(timeout=600)
    finally:
        if trainer.poll() is None:
            trainer.kill()


def run(args) -> int:
    from dataservice.local_cluster import LocalCluster

    args.dir = args.dir or tempfile.mkdtemp(prefix="resume-training-")
    with LocalCluster(num_workers=2, fault_tolerant_mode=True, worker_options={"heartbeat_interval_ms": 300}) as c:
        args.service = c.target
        print(f"cluster: dispatcher {c.address}, workers {[w.address for w in c.workers]}; logs in {args.dir}")
        run_trainer(args, kill_after_step=args.kill_after_step)
        if args.restart_dispatcher:
            c.restart_dispatcher()
            print(f"dispatcher restarted (SIGKILL, then a new process on {c.address})", flush=True)
        if args.replace_workers:
            for worker in c.workers:
                worker.kill()
            c.workers.clear()
            c.add_workers(2)
            print(f"workers replaced: now {[w.address for w in c.workers]}", flush=True)
        code = run_trainer(args)
        if code != 0:
            print(f"the resumed trainer failed with status {code}")
            return 1
        problems = check(args, copies=2 if args.mode == "parallel_epochs" else 1)
    for problem in problems:
        print("PROBLEM:", problem)
    copies = "twice (once from each worker)" if args.mode == "parallel_epochs" else "once"
    print(f"every example seen {copies} per epoch" if not problems else "the check FAILED", flush=True)
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="distributed_epoch", choices=["distributed_epoch", "parallel_epochs"])
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--kill_after_step", type=int, default=40)
    parser.add_argument("--step_ms", type=float, default=10.0, help="milliseconds a step takes besides its math")
    parser.add_argument("--restart_dispatcher", action="store_true", help="restart the dispatcher before resuming")
    parser.add_argument("--replace_workers", action="store_true", help="new worker processes before resuming")
    parser.add_argument("--trainer", action="store_true", help="run the trainer only (needs --service, --dir)")
    parser.add_argument("--service", help="the trainer's dispatcher, grpc://host:port")
    parser.add_argument("--dir", help="checkpoints and step log (default: a new temporary folder)")
    args = parser.parse_args()
    if args.trainer:
        if not args.service or not args.dir:
            parser.error("--trainer needs --service and --dir")
        train(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
