"""The worker process the Rust harness runs implementations in.

`python -m grpo_verify_worker` speaks the frame protocol of
docs/worker-protocol.md on its standard input and output.
"""
