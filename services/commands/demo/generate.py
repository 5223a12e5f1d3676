"""Generate the demo update stream: a small LSBench-shaped social network as RDF Patch.

Deterministic (a seeded ``random.Random``), so ``python -m services.commands.demo.generate`` rewrites
``services/commands/demo/updates.rdfp`` byte for byte; a test checks that the shipped file is what this script
makes.  The vocabulary is LSBench's (SIB: ``sioc:``, ``foaf:``, ``sib:``, ``dc:`` ...), so the example
queries read like the benchmark's, but the project does not need the benchmark files.

The stream: users with a person (first/last name), then a mix of events -- follows (``foaf:knows``),
posts (a transaction: type, creator, creation date, hashtags), photos (type, creator, location, date),
likes -- and retractions (unlike, unfollow, whole-post deletion in one transaction), about 20% of all
updates.  Transactions ``TX .. TC`` keep a post's triples together.
"""

from __future__ import annotations

import argparse
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

__all__ = ["generate", "DEFAULT_PATH"]

DEFAULT_PATH = Path(__file__).with_name("updates.rdfp")

PREFIXES = {
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "xsd": "http://www.w3.org/2001/XMLSchema#",
    "foaf": "http://xmlns.com/foaf/0.1/",
    "dc": "http://purl.org/dc/elements/1.1/",
    "sioc": "http://rdfs.org/sioc/ns#",
    "dbpo": "http://dbpedia.org/ontology/",
    "sib": "http://www.ins.cwi.nl/sib/vocabulary/",
    "sibp": "http://www.ins.cwi.nl/sib/person/",
    "sibu": "http://www.ins.cwi.nl/sib/user/",
    "sibpo": "http://www.ins.cwi.nl/sib/post/",
    "sibpho": "http://www.ins.cwi.nl/sib/photoalbum/photo/",
}
FIRST = ["Andrew", "Maria", "Wei", "Fatima", "Lars", "Aiko", "Carlos", "Nadia", "Tom", "Priya", "Jonas", "Lea"]
LAST = ["Bledsoe", "Garcia", "Chen", "Haddad", "Berg", "Sato", "Silva", "Novak", "Smith", "Iyer", "Weber", "Rossi"]
TAGS = ["music", "kafka", "rdf", "travel", "food", "football", "art", "science"]
PLACES = ["Amsterdam", "Hebi", "Lisbon", "Kyoto", "Nairobi", "Toronto"]
START = datetime(2010, 2, 1, tzinfo=timezone.utc)


def _date(minutes: int) -> str:
    stamp = (START + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f'"{stamp}"^^xsd:dateTime'


def generate(users: int = 50, events: int = 1400, seed: int = 1000) -> str:
    """The patch text: ``users`` users, then ``events`` random events (about 3,000 updates by default)."""
    rng = random.Random(seed)
    out = [f"PA {name}: <{iri}> ." for name, iri in PREFIXES.items()]
    add = lambda s, p, o: out.append(f"A {s} {p} {o} .")  # noqa: E731
    delete = lambda s, p, o: out.append(f"D {s} {p} {o} .")  # noqa: E731
    for u in range(1, users + 1):
        add(f"sibu:u{u}", "sioc:account_of", f"sibp:p{u}")
        add(f"sibp:p{u}", "foaf:firstName", f'"{FIRST[u % len(FIRST)]}"')
        add(f"sibp:p{u}", "foaf:lastName", f'"{LAST[(u * 7) % len(LAST)]}"')
    knows: set[tuple[int, int]] = set()
    posts: dict[int, list[tuple[str, str, str]]] = {}
    likes: set[tuple[int, str]] = set()
    items: list[str] = []  # posts and photos that can be liked
    next_post = next_photo = 1
    # The multi-part example query is gated by this one follow: it comes, goes and comes back.
    gate = {events // 4: True, events * 3 // 5: False, events * 4 // 5: True}
    for minute in range(events):
        if minute in gate and gate[minute] != ((1, 2) in knows):
            (knows.add if gate[minute] else knows.discard)((1, 2))
            (add if gate[minute] else delete)("sibu:u1", "foaf:knows", "sibu:u2")
        roll = rng.random()
        user = rng.randint(1, users)
        if roll < 0.30:  # follow: a friend of a friend half of the time, so triangles close
            friends = [b for a, b in knows if a == user]
            pool = [c for a, c in knows if friends and a == rng.choice(friends)] if friends and rng.random() < 0.5 else []
            other = rng.choice(pool) if pool else rng.randint(1, users)
            if other != user and (user, other) not in knows:
                knows.add((user, other))
                add(f"sibu:u{user}", "foaf:knows", f"sibu:u{other}")
        elif roll < 0.47:  # a post, as one transaction
            post = f"sibpo:po{next_post}"
            triples = [(post, "rdf:type", "sib:Post"), (f"sibu:u{user}", "sioc:creator_of", post), (post, "dc:created", _date(minute))]
            triples += [(post, "sib:hashtag", f'"{tag}"') for tag in rng.sample(TAGS, rng.randint(1, 2))]
            out.append("TX .")
            for triple in triples:
                add(*triple)
            out.append("TC .")
            posts[next_post] = triples
            items.append(post)
            next_post += 1
        elif roll < 0.58:  # a photo
            photo = f"sibpho:pho{next_photo}"
            for triple in [(photo, "rdf:type", "sib:Photo"), (f"sibu:u{user}", "sioc:creator_of", photo),
                           (photo, "dbpo:location", f'"{rng.choice(PLACES)}"'), (photo, "dc:created", _date(minute))]:
                add(*triple)
            items.append(photo)
            next_photo += 1
        elif roll < 0.76:  # a like
            if items:
                item = rng.choice(items[-40:])  # recent items get the likes, as in a feed
                if (user, item) not in likes:
                    likes.add((user, item))
                    add(f"sibu:u{user}", "sib:like", item)
        elif roll < 0.87:  # unlike
            if likes:
                who, item = rng.choice(sorted(likes))
                likes.discard((who, item))
                delete(f"sibu:u{who}", "sib:like", item)
        elif roll < 0.94:  # unfollow
            if knows:
                a, b = rng.choice(sorted(knows))
                knows.discard((a, b))
                delete(f"sibu:u{a}", "foaf:knows", f"sibu:u{b}")
        elif posts:  # a post is deleted with all its triples, in one transaction
            number = rng.choice(sorted(posts))
            post = f"sibpo:po{number}"
            out.append("TX .")
            for triple in posts.pop(number):
                delete(*triple)
            out.append("TC .")
            items.remove(post)
            for who, item in sorted(likes):
                if item == post:
                    likes.discard((who, item))
                    delete(f"sibu:u{who}", "sib:like", item)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write the demo update stream (RDF Patch)")
    parser.add_argument("--out", default=str(DEFAULT_PATH), help=f"output file (default {DEFAULT_PATH})")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--events", type=int, default=1400)
    parser.add_argument("--seed", type=int, default=1000)
    args = parser.parse_args(argv)
    text = generate(args.users, args.events, args.seed)
    Path(args.out).write_text(text, encoding="utf-8")
    updates = sum(1 for line in text.splitlines() if line[:2] in ("A ", "D "))
    deletes = sum(1 for line in text.splitlines() if line.startswith("D "))
    print(f"wrote {args.out}: {updates} updates ({deletes} deletions, {100 * deletes // max(updates, 1)}%)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
