"""Registers the digits pipelines with a dispatcher, for trainers that read without TensorFlow.

    python -m dataservice.demo.register_digits --dispatcher_address grpc://HOST:PORT --data_dir DIR --batch 64

Writes the digits as TFRecord shards under DIR (sample_data.py), registers the
training pipeline (shuffled) and the test pipeline, each batched on the
workers, and prints their dataset ids as JSON ({"train": ..., "test": ...}).
The JAX and PyTorch demos (jax_mlp.py, torch_mlp.py) run it as a process of
their own (register_in_a_process): this process imports TensorFlow, the
trainer never does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from dataservice.quiet import quiet_tensorflow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dispatcher_address", required=True)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    quiet_tensorflow()
    import dataservice
    from dataservice.demo import sample_data

    train_files, test_files = sample_data.write_digits(args.data_dir, num_shards=8)
    train = sample_data.digits_dataset(train_files, args.batch, shuffle_buffer=512)
    test = sample_data.digits_dataset(test_files, args.batch)
    ids = {
        name: dataservice.register_dataset(args.dispatcher_address, dataset).numpy().decode()
        for name, dataset in (("train", train), ("test", test))
    }
    print(json.dumps(ids), flush=True)
    return 0


def register_in_a_process(dispatcher_address: str, data_dir: str, batch: int) -> dict[str, str]:
    """Runs this module in a new process (which imports TensorFlow; the caller needs not);
    returns the dataset ids it registered, {"train": ..., "test": ...}."""
    registered = subprocess.run(
        [
            sys.executable,
            "-m",
            "dataservice.demo.register_digits",
            f"--dispatcher_address={dispatcher_address}",
            f"--data_dir={data_dir}",
            f"--batch={batch}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if registered.returncode != 0:
        raise RuntimeError(f"registering the digits pipelines failed:\n{registered.stderr[-3000:]}")
    return json.loads(registered.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
