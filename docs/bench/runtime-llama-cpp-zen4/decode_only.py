"""The run's speed-ups over plain decoding two ways, from its results.jsonl: as the report counts them
(new tokens over the whole request's time, prefill included) and over the decoding alone (new tokens
over the time after the prefill). Sampled answers end at different lengths (an end-of-text token
drawn early), so at T = 1 the whole-time ratio weighs the prefill unevenly between two methods on
the same prompt; greedy answers are the same tokens, so only the prefill's share differs.

    python docs/bench/runtime-llama-cpp-zen4/decode_only.py > docs/bench/runtime-llama-cpp-zen4/decode-only.txt
"""

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).with_name("results.jsonl")


def stats(row: dict, method: str) -> dict:
    found = row["methods"][method]["stats"]
    return found[0] if isinstance(found, list) else found


def main() -> None:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    print("temperature  method  × plain (whole time)  × plain (decoding alone)  prompts where the two lengths differ")
    for temperature in sorted({row["temperature"] for row in rows}):
        for method in ("ngram", "suffix", "auto"):
            whole, decoding, differ = [], [], 0
            for row in rows:
                if row["temperature"] != temperature:
                    continue
                ours, plain = stats(row, method), stats(row, "plain")
                whole.append(ours["tokens_per_second"] / plain["tokens_per_second"])
                rate = [s["new_tokens"] / (s["total_seconds"] - s["prefill_seconds"]) for s in (ours, plain)]
                decoding.append(rate[0] / rate[1])
                differ += ours["new_tokens"] != plain["new_tokens"]
            print(f"{temperature:>11}  {method:>6}  {statistics.mean(whole):>20.3f}  {statistics.mean(decoding):>24.3f}  "
                  f"{differ} of {len(whole)}")


if __name__ == "__main__":
    main()
