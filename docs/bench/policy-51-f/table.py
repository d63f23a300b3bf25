"""The table of docs/bench/policy-51-f/README.md from kept.py's JSON files.

    .venv/bin/python docs/bench/policy-51-f/table.py docs/bench/policy-51-f/*.json

Two readings of the gain kept, both from the same interleaved repeats:
- of medians: alone and last each × plain as the ratio of their median tokens/s to plain's, then
  (last − 1) / (alone − 1), the issue's formula; the three medians come from different repeats;
- paired: the median over repeats of last / alone within a repeat (the two ran in the same minute,
  a few seconds apart), applied to alone's × plain: (alone · paired − 1) / (alone − 1).
"""

import json
import statistics
import sys

print("| prompt | process (order) | plain tokens/s | alone × plain | last × plain | last / alone, paired "
      "| kept, of medians | kept, paired | drafted / accepted alone | last |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
for path in sys.argv[1:]:
    d = json.load(open(path))
    runs = d["runs"]
    last_name = next(n for n in runs if n not in ("plain", "alone"))
    rate = {n: [r["tokens_per_second"] for r in rs] for n, rs in runs.items()}
    alone, last = d["times_plain"]["alone"], d["times_plain"][last_name]
    paired = statistics.median(b / a for a, b in zip(rate["alone"], rate[last_name]))
    rounds = {n: sorted({(r["drafted"], r["accepted"]) for r in runs[n]}) for n in ("alone", last_name)}
    span = {n: f"{min(r)[0]}–{max(r)[0]} / {min(a for _, a in r)}–{max(a for _, a in r)}" for n, r in rounds.items()}
    print(f"| {d['prompt']} | {path.rsplit('/', 1)[-1]} ({', '.join(d['order'])}) "
          f"| {d['median_tokens_per_second']['plain']:.1f} | {alone:.3f} | {last:.3f} | {paired:.3f} "
          f"| {(last - 1) / (alone - 1):.0%} | {(alone * paired - 1) / (alone - 1):.0%} "
          f"| {span['alone']} | {span[last_name]} |")
