"""Writes topics.tsv: short English sentences about four topics, generated from the templates below.

The sentences are synthetic (written for autodl, no third-party text), so the data set is dedicated
to the public domain (CC0 1.0). Run ``python include/data/text/make_topics.py`` to rebuild it; the
seed is fixed, so the file comes out byte for byte the same.

Each row is ``split<TAB>label<TAB>sentence``; ``split`` is ``train`` (85%) or ``val`` (15%). Some
words (people, places, times, feelings) are shared by every topic and one sentence in ten borrows a
noun from another topic, so the classifier has to weigh words rather than spot a single one.
"""

from __future__ import annotations

import random
from pathlib import Path

LABELS = ["weather", "sports", "food", "technology"]
SENTENCES_PER_LABEL = 900
SEED = 20260101

SHARED = {
    "who": ["my neighbour", "the old man", "our team lead", "a student", "my sister", "the driver", "everyone",
            "a tourist", "the teacher", "my friend", "the reporter", "a child", "our family", "the new hire"],
    "when": ["this morning", "last night", "on monday", "after lunch", "at dawn", "all weekend", "yesterday",
             "this afternoon", "before dinner", "on the way home", "today", "around noon"],
    "feel": ["was surprised", "was happy", "complained", "laughed", "was worried", "did not care", "was tired",
             "got excited", "stayed calm", "was annoyed"],
    "where": ["in the city", "near the station", "at the park", "downtown", "in the village", "by the river",
              "at home", "in the office", "on the coast", "up north"],
}

TOPIC = {
    "weather": {
        "noun": ["rain", "snow", "fog", "wind", "storm", "sunshine", "heat", "frost", "hail", "thunder", "drizzle",
                 "clouds", "humidity", "breeze"],
        "verb": ["fell", "arrived", "cleared", "grew stronger", "faded", "returned", "lingered", "swept in"],
        "adj": ["cold", "warm", "grey", "windy", "sunny", "chilly", "humid", "stormy", "mild", "freezing"],
        "thing": ["the forecast", "the umbrella", "the temperature", "the sky", "the radar map", "the weather report"],
    },
    "sports": {
        "noun": ["match", "goal", "race", "tournament", "penalty", "season", "final", "team", "coach", "referee",
                 "striker", "marathon", "league", "score"],
        "verb": ["was won", "ended in a draw", "went to extra time", "was cancelled", "was close", "turned around",
                 "drew a big crowd", "was replayed"],
        "adj": ["fast", "tough", "exciting", "defensive", "aggressive", "tired", "unbeaten", "skilled", "young",
                "determined"],
        "thing": ["the stadium", "the scoreboard", "the trophy", "the training session", "the league table",
                  "the starting line"],
    },
    "food": {
        "noun": ["soup", "bread", "curry", "salad", "noodles", "cake", "dumplings", "pasta", "coffee", "rice",
                 "cheese", "pancakes", "stew", "sauce"],
        "verb": ["was cooked", "tasted great", "was too salty", "was served", "burned", "was shared",
                 "came out fresh", "smelled wonderful"],
        "adj": ["spicy", "sweet", "crispy", "fresh", "bitter", "creamy", "salty", "tender", "sour", "delicious"],
        "thing": ["the recipe", "the kitchen", "the menu", "the oven", "the restaurant", "the dinner table"],
    },
    "technology": {
        "noun": ["laptop", "update", "server", "phone", "network", "battery", "database", "browser", "printer",
                 "router", "compiler", "app", "keyboard", "cluster"],
        "verb": ["crashed", "was updated", "rebooted", "ran slowly", "was patched", "lost its data",
                 "stopped responding", "was replaced"],
        "adj": ["slow", "new", "broken", "fast", "buggy", "secure", "outdated", "wireless", "encrypted", "stable"],
        "thing": ["the software", "the firmware", "the login page", "the data center", "the release notes",
                  "the help desk"],
    },
}

TEMPLATES = [
    "{when} the {adj} {noun} {verb} {where}",
    "{who} {feel} because the {noun} {verb}",
    "{who} said {thing} looked {adj} {when}",
    "the {noun} {verb} and {who} {feel}",
    "{where} the {noun} was {adj} {when}",
    "{who} talked about the {adj} {noun} and {thing}",
    "nobody expected the {noun} to be so {adj}",
    "{thing} mentioned a {adj} {noun} {when}",
    "after the {noun} {verb} {who} checked {thing}",
    "{who} {feel} when the {adj} {noun} {verb} {where}",
]


def sentence(rng: random.Random, label: str) -> str:
    words = TOPIC[label]
    other = TOPIC[rng.choice([x for x in LABELS if x != label])]
    fill = {key: rng.choice(values) for key, values in SHARED.items()}
    fill.update({key: rng.choice(values) for key, values in words.items()})
    text = rng.choice(TEMPLATES).format(**fill)
    if rng.random() < 0.1:  # a distractor noun from another topic
        text += f" despite the {rng.choice(other['noun'])}"
    return text


def main() -> None:
    rng = random.Random(SEED)
    rows: list[tuple[str, str]] = []  # (label, sentence)
    for label in LABELS:
        seen: set[str] = set()
        while len(seen) < SENTENCES_PER_LABEL:
            seen.add(sentence(rng, label))
        rows.extend((label, text) for text in sorted(seen))
    rng.shuffle(rows)
    out = Path(__file__).with_name("topics.tsv")
    with out.open("w") as fh:
        fh.write("split\tlabel\tsentence\n")
        for i, (label, text) in enumerate(rows):
            split = "val" if i % 20 < 3 else "train"
            fh.write(f"{split}\t{label}\t{text}\n")


if __name__ == "__main__":
    main()
