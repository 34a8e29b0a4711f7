# The two commands of the README, and the steps they are made of.
#   make demo   set up .venv if needed, train the tiny ViT on real digits, print a memory table
#   make test   set up .venv if needed, run the test suite
PYTHON := .venv/bin/python
DEMO_WORK_DIR := work_dirs/demo

.PHONY: env demo test benchmark

env:
	bash tools/setup_env.sh

demo: env
	$(PYTHON) tools/train.py configs/tiny/vit-tiny_mnist5k.py --work-dir $(DEMO_WORK_DIR)
	$(PYTHON) tools/benchmark.py --config configs/tiny/vit-tiny_mnist5k.py --out $(DEMO_WORK_DIR)/memory

test: env
	$(PYTHON) -m pytest

benchmark: env
	$(PYTHON) tools/benchmark.py
