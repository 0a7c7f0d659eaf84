# Two entry points for a newcomer: `make demo` and `make test`. Both create .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python
DEMO := demo_output
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

$(VENV)/.installed: requirements.txt setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned, so that the CPU build on this disk is used instead of a multi-GB CUDA download.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

.PHONY: venv demo test lint
venv: $(VENV)/.installed

demo: venv
	rm -rf $(DEMO)
	$(PY) -m tuning.utils.tiny_model $(DEMO)/tiny-llama
	$(PY) tuning/sft_trainer.py --model_name_or_path $(DEMO)/tiny-llama \
		--training_data_path tuning/data/samples/train.jsonl --dataset_text_field output \
		--response_template '\n### Response:' --peft_method lora --torch_dtype float32 \
		--num_train_epochs 1 --per_device_train_batch_size 4 --logging_strategy steps --logging_steps 2 \
		--save_strategy no --output_dir $(DEMO)/run
	@echo "--- demo outputs in $(DEMO)/run:" && ls -1 $(DEMO)/run && head -3 $(DEMO)/run/training_logs.jsonl

test: venv
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
