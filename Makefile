# Conveniences over run.py (which needs only Python 3.11+).
.PHONY: demo test bench bench-quick
demo:
	python3 run.py demo
test:
	python3 run.py test
bench:
	python3 run.py bench
bench-quick:
	python3 run.py bench --quick
