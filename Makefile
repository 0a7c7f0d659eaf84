# Two entry points for a newcomer: `make demo` and `make test`. Both create .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python
DEMO := demo_output
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
# A module's bytecode is written the first time something imports it, even where the environment says not to (a
# bytecode-less venv would compile torch and transformers again in every process): the venv's files that nothing
# imports, most of them, are never compiled.
unexport PYTHONDONTWRITEBYTECODE

$(VENV)/.installed: requirements.txt setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch pinned, so that the CPU build on this disk is used instead of a multi-GB CUDA download. No bytecode at
	# install (PYTHONDONTWRITEBYTECODE above).
	$(PY) -m pip install --quiet --no-compile torch==2.13.0 -e '.[dev]'
	touch $@

.PHONY: venv demo test test-fast lint gpu-check gpu-wheels gpu-rehearsal
venv: $(VENV)/.installed

demo: venv
	rm -rf $(DEMO)
	$(PY) -m tuning.utils.tiny_model $(DEMO)/tiny-llama
	# Two benchmark runs (batch size 2 and 4) of LoRA on the tiny model, tracked in a local Aim repo. The warmup
	# lasts 0.5 s (of about 2 s of steps): the first run's opening steps share 2 vCPUs with Aim creating its repo, and
	# are not what it measures.
	for batch in 2 4; do \
		$(PY) wrappers/bench_train.py --model_name_or_path $(DEMO)/tiny-llama \
			--training_data_path tuning/data/samples/train.jsonl --dataset_text_field output \
			--response_template '\n### Response:' --peft_method lora --torch_dtype float32 --use_flash_attn False \
			--max_steps 300 --per_device_train_batch_size $$batch --logging_strategy steps --logging_steps 10 \
			--save_strategy no --output_dir $(DEMO)/run-bs$$batch \
			--tracker file_logger aim --aim_repo $(DEMO)/aim --experiment demo \
			--metadata "{\"benchmark\": \"demo\", \"batch_size\": $$batch}" --system_metrics_interval 1 \
			--skip_warmup_steps 2 --skip_warmup_seconds 0.5 || exit 1; \
	done
	# It prints the points table (report.md adds a row per run, report.csv every column).
	$(PY) wrappers/bench_report.py $(DEMO) --labels batch_size --x batch_size --output_dir $(DEMO)/report
	@echo "--- outputs:" && ls -1 $(DEMO)/run-bs4 $(DEMO)/report

# One worker per core (the tests train single-threaded); the tests sharing a fixture that runs jobs or a server go to
# one worker (tests/conftest.py SHARED_FIXTURES).
test: venv
	$(PY) -m pytest -q -n auto --dist loadgroup

# The inner loop, under 30 seconds: everything but the tests marked slow (subprocess jobs, torchrun, Aim writers and
# servers), a worker per core as `make test`. Its summary names any unmarked test that took seconds
# (tests/conftest.py): mark it slow or speed it up.
test-fast: venv
	$(PY) -m pytest -q -m "not slow" -n auto --dist loadgroup

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# On one CUDA device, in under 8 minutes, downloading nothing itself: benchmarks/gpu_check.py (a ~1 B Llama,
# bench_train against bare TRL, a real OOM, NVML series). Where .venv does not exist yet, `venv` above makes it, and
# its `pip install torch==2.13.0` must then find a CUDA build of torch (a local wheel or index on that machine); the
# NVML series need the nvml extra, installed here when missing (where that fails, the check runs without them).
gpu-check: venv
	-$(PY) -c 'import pynvml' 2>/dev/null || $(PY) -m pip install --quiet -e '.[nvml]'
	$(PY) -m benchmarks.gpu_check

# For the GPU machine, which has no network (benchmarks/gpu_device.sh runs there): the wheels it lacks, into the
# ignored .whl/ (under 48 MiB), resolved against its packages (benchmarks/gpu_machine_packages.txt), by a recent pip
# in a small virtual environment of its own (pip resolves from the registry's metadata, without downloading wheels).
REHEARSAL := .gpu-rehearsal
WHEELS_VENV := $(REHEARSAL)/pip
$(WHEELS_VENV)/bin/python:
	python3 -m venv $(WHEELS_VENV)
	$(WHEELS_VENV)/bin/python -m pip install --quiet --upgrade 'pip>=25'

gpu-wheels: $(WHEELS_VENV)/bin/python
	$(WHEELS_VENV)/bin/python benchmarks/gpu_wheels.py --output .whl

# The GPU machine's run rehearsed on CPU: a virtual environment of Python 3.12 with the GPU machine's versions of the
# packages the check uses (torch's CUDA build, which runs on CPU too; several GB, once), then, with the registry out
# of reach, gpu_device.sh --rehearsal installs .whl/ the way it does there and runs the check's CPU path.
REHEARSAL_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
$(REHEARSAL)/venv/.installed: .whl/gpu_machine_closure.txt
	rm -rf $(REHEARSAL)/venv
	$(REHEARSAL_PYTHON) -m venv $(REHEARSAL)/venv
	$(REHEARSAL)/venv/bin/python -m pip install --quiet --no-deps -r .whl/gpu_machine_closure.txt
	touch $@

.whl/gpu_machine_closure.txt:
	@echo "no .whl/: run \`make gpu-wheels\` first" >&2 && exit 1

gpu-rehearsal: $(REHEARSAL)/venv/.installed
	rm -rf $(REHEARSAL)/out
	env PATH="$(CURDIR)/$(REHEARSAL)/venv/bin:$$PATH" OUT="$(CURDIR)/$(REHEARSAL)/out" PIP_NO_INDEX=1 \
		HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 bash benchmarks/gpu_device.sh --rehearsal
