"""LSBench-style update streams for the engine benchmark: loader, generator, deletion schedule.

Two sources of the same shape (a static social graph plus post / photo / post-like / photo-like
streams, over the LSBench "SIB" vocabulary):

- `load_dir(path)`: the LSBench generator's output (`mr0_sibdataset<N>.nt.gz`,
  `rdf{Post,Photo,PostLike,PhotoLike}Stream<N>.nt.gz`).  Despite the `.nt` name the files are
  Turtle (they start with `@prefix` lines), so they go through `cbgp.inputs.formats.parse_turtle`,
  the product's own parser, whose cost the benchmark reports.
- `generate(users, seed)`: a deterministic stand-in used when the data is absent (CI, a fresh
  machine).  Same predicates and classes, and degrees tuned to the 1000-user LSBench output:
  ~19 friends per user, ~5 posts with ~3 hashtags each, one album of ~19 photos with ~4.4
  user tags each, ~19 post likes and ~84 photo likes per user, skewed (Zipf-like) choices
  of browsers, hashtags, places and interests.

`build_updates(dataset)` turns either into one replayable stream: the static graph inserted
first, then the four streams merged in proportion (they are each in time order), then a
fraction (20% by default) of all triples deleted, each at a random point within a window
after its own insertion.  Duplicate inserts are dropped (the like streams repeat each like
several times; a repeated insert of a present triple is a no-op for every system and would
only inflate throughput), so every insert adds a triple and every delete removes a present one.
"""

from __future__ import annotations

import gzip
import itertools
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

Triple = tuple[str, str, str]
UpdateRow = tuple[int, str, str, str]  # (+1 insert | -1 delete, s, p, o), canonical N-Triples terms

# The shared data sits beside the repository (shared/ next to the clone); the project runs without it.
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "lsbench-1000"
STREAMS = ("post", "photo", "postlike", "photolike")
_FILES = {
    "static": "mr0_sibdataset{n}.nt.gz",
    "post": "rdfPostStream{n}.nt.gz",
    "photo": "rdfPhotoStream{n}.nt.gz",
    "postlike": "rdfPostLikeStream{n}.nt.gz",
    "photolike": "rdfPhotoLikeStream{n}.nt.gz",
}

# The SIB vocabulary (as used by the LSBench generator's output prefixes).
RDF = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
FOAF = "http://xmlns.com/foaf/0.1/"
XSD = "http://www.w3.org/2001/XMLSchema#"
DC = "http://purl.org/dc/elements/1.1/"
DCTERMS = "http://purl.org/dc/terms/"
SIOC = "http://rdfs.org/sioc/ns#"
SIOCT = "http://rdfs.org/sioc/type#"
DBP = "http://dbpedia.org/resource/"
DBPO = "http://dbpedia.org/ontology/"
DBPPROP = "http://dbpedia.org/property/"
SIB = "http://www.ins.cwi.nl/sib/vocabulary/"
SIBP = "http://www.ins.cwi.nl/sib/person/"
SIBU = "http://www.ins.cwi.nl/sib/user/"
SIBFO = "http://www.ins.cwi.nl/sib/forum/"
SIBFR = "http://www.ins.cwi.nl/sib/friendship/"
SIBG = "http://www.ins.cwi.nl/sib/group/"
SIBGM = "http://www.ins.cwi.nl/sib/group/membership/"
SUBCLASS_OF = "<http://www.w3.org/2000/01/rdf-schema#subClassOf>"
# A small SIOC/SIB class hierarchy (LSBench has none) for class-hierarchy paths (rdf:type/rdfs:subClassOf*),
# published before the stream: insertions as the stream's updates are, (diff, s, p, o).
CLASS_HIERARCHY = [(1, f"<{a}>", SUBCLASS_OF, f"<{b}>") for a, b in (
    (f"{SIB}Photo", f"{SIOC}Item"), (f"{SIB}Post", f"{SIOC}Post"), (f"{SIB}Comment", f"{SIOC}Post"),
    (f"{SIOC}Post", f"{SIOC}Item"), (f"{SIB}User", f"{SIOC}UserAccount"), (f"{SIB}Group", f"{SIOC}Usergroup"),
    (f"{SIOCT}ImageGallery", f"{SIOC}Container"), (f"{SIOC}Forum", f"{SIOC}Container"),
    (f"{SIOC}Container", "http://www.w3.org/2000/01/rdf-schema#Resource"),
    (f"{SIOC}Item", "http://www.w3.org/2000/01/rdf-schema#Resource"))]
SIBPO = "http://www.ins.cwi.nl/sib/post/"
SIBC = "http://www.ins.cwi.nl/sib/post/comment/"
SIBPHO = "http://www.ins.cwi.nl/sib/photoalbum/photo/"
SIBPHA = "http://www.ins.cwi.nl/sib/photoalbum/"

PREFIXES = {
    "rdf": RDF, "foaf": FOAF, "xsd": XSD, "dc": DC, "dcterms": DCTERMS, "sioc": SIOC, "sioct": SIOCT,
    "dbp": DBP, "dbpo": DBPO, "dbpprop": DBPPROP, "sib": SIB, "sibp": SIBP, "sibu": SIBU,
    "sibfo": SIBFO, "sibfr": SIBFR, "sibg": SIBG, "sibgm": SIBGM, "sibpo": SIBPO, "sibc": SIBC,
    "sibpho": SIBPHO, "sibpha": SIBPHA,
}


@dataclass
class Dataset:
    """Triples of the static graph and of each stream, in source order (canonical N-Triples terms)."""

    static: list[Triple]
    streams: dict[str, list[Triple]]
    source: str
    parse_seconds: float = 0.0  # time spent in the parser (0 for the generator)
    parse_errors: int = 0


@dataclass
class UpdateStream:
    updates: list[UpdateRow]
    n_static: int  # the first n_static updates are the static graph's inserts
    source: str
    stats: dict[str, int] = field(default_factory=dict)


# --- loading ---------------------------------------------------------------------------------------


def find_files(data_dir: Path) -> dict[str, Path] | None:
    """The five LSBench files in `data_dir` (any user count N), or None when any is missing."""
    statics = sorted(data_dir.glob("mr0_sibdataset*.nt.gz")) if data_dir.is_dir() else []
    if not statics:
        return None
    n = statics[0].name[len("mr0_sibdataset") : -len(".nt.gz")]
    files = {name: data_dir / pattern.format(n=n) for name, pattern in _FILES.items()}
    return files if all(path.is_file() for path in files.values()) else None


def load_dir(data_dir: Path) -> Dataset:
    from cbgp.inputs.formats import InputError, parse_turtle  # the product's parser: its cost is reported

    files = find_files(data_dir)
    if files is None:
        raise FileNotFoundError(f"no LSBench files (mr0_sibdataset*.nt.gz + 4 streams) in {data_dir}")
    parsed: dict[str, list[Triple]] = {}
    seconds = 0.0
    errors = 0
    for name, path in files.items():
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
        start = time.perf_counter()
        triples: list[Triple] = []
        for item in parse_turtle(text):
            if isinstance(item, InputError):
                errors += 1
                continue
            triples.append((item.s, item.p, item.o))
        seconds += time.perf_counter() - start
        parsed[name] = triples
    return Dataset(parsed.pop("static"), parsed, str(data_dir), seconds, errors)


# --- generator -------------------------------------------------------------------------------------

_BROWSERS = (("Firefox", 42), ("Chrome", 28), ("Internet Explorer", 24), ("Safari", 4), ("Opera", 2))
_AGENTS = ("iPad", "iPhone", "Sony Ericsson", "HTC", "RIM BlackBerry", "Nokia", "Samsung", "LG", "Motorola")
_ARTISTS = (
    "Andrea Bocelli", "Adam Levine", "Bette Midler", "Madonna", "Janet Jackson", "Biagio Antonacci",
    "Cyndi Lauper", "Britney Spears", "Kylie Minogue", "Barry Manilow", "John Lennon", "Yoko Ono",
    "Celine Dion", "Aaron Carter", "Christina Aguilera", "Bill Kaulitz", "Dido", "Cher",
)
_WORDS = (
    "album", "Adam", "Levine", "The", "is", "and", "Madonna", "Stars", "Hat", "Full", "singer", "Live",
    "Records", "Tour", "Jazz", "Pop", "Christmas", "Songs", "Legends", "Love", "Night", "Video", "Home",
)
_COUNTRIES = (
    "Peoples_Republic_of_China", "India", "United_States", "Indonesia", "Brazil", "Pakistan", "Germany",
    "Netherlands", "Bulgaria", "Swaziland", "Northern_Ireland", "Ukraine", "Italy", "Spain", "France",
)
_FIRST = ("Andrew", "Maria", "Wei", "Anil", "John", "Li", "Sara", "Ahmed", "Olga", "Jose", "Yuki", "Ana")
_LAST = ("Bledsoe", "Zhang", "Kumar", "Smith", "Garcia", "Wang", "Khan", "Ivanova", "Silva", "Sato")


def _iri(base: str, local: str) -> str:
    return f"<{base}{local}>"


def _lit(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _typed(value: str, datatype: str) -> str:
    return f'"{value}"^^<{XSD}{datatype}>'


def _zipf_weights(n: int, s: float = 1.0) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)]


def generate(users: int = 1000, seed: int = 1) -> Dataset:
    """A deterministic LSBench-shaped dataset (see the module docstring for the target degrees)."""
    rng = random.Random(seed)
    a = f"<{RDF}type>"
    p_ = {name: f"<{base}{name}>" for base, names in (
        (FOAF, ("knows", "firstName", "lastName", "based_near", "gender", "birthday")),
        (SIOC, ("account_of", "subscriber_of", "moderator_of", "creator_of", "container_of", "content",
                "ip_address", "has_member", "reply_of")),
        (SIB, ("memb", "initiator", "requested", "approved", "interest", "browser", "hashtag", "usertag",
               "like", "agent", "member_of_membership", "group_of_membership")),
    ) for name in names}
    created = f"<{DC}created>"
    title = f"<{DCTERMS}title>"
    location = f"<{DBPO}location>"
    latd, longd = f"<{DBPPROP}latd>", f"<{DBPPROP}longd>"
    browser_names = [b for b, _ in _BROWSERS]
    browser_weights = [w for _, w in _BROWSERS]
    artist_weights = _zipf_weights(len(_ARTISTS), 0.6)
    word_weights = _zipf_weights(len(_WORDS), 0.9)
    places = list(_COUNTRIES) + [f"Place_{k}" for k in range(max(50, users))]
    place_weights = _zipf_weights(len(places), 0.5)
    country_weights = _zipf_weights(len(_COUNTRIES), 0.8)
    user = [_iri(SIBU, f"u{i}") for i in range(users)]
    activity = [rng.paretovariate(2.0) for _ in range(users)]  # skews likes / tags / friendships
    # Cumulative weights, computed once: `choices(weights=...)` would re-accumulate on every call.
    act_cum = list(itertools.accumulate(activity))
    everyone = range(users)
    browser_cum = list(itertools.accumulate(browser_weights))
    place_cum = list(itertools.accumulate(place_weights))

    static: list[Triple] = []
    for i in range(users):
        person, u = _iri(SIBP, f"p{i}"), user[i]
        country = rng.choices(_COUNTRIES, country_weights)[0]
        static += [
            (person, a, f"<{FOAF}Person>"),
            (person, p_["firstName"], _lit(rng.choice(_FIRST))),
            (person, p_["lastName"], _lit(rng.choice(_LAST))),
            (person, p_["based_near"], _iri(DBP, country)),
            (person, p_["based_near"], _lit(country)),
            (person, latd, _typed(f"{rng.uniform(-60, 70):.6f}", "double")),
            (person, longd, _typed(f"{rng.uniform(-180, 180):.6f}", "double")),
            (person, p_["browser"], _lit(rng.choices(browser_names, cum_weights=browser_cum)[0])),
            (person, p_["gender"], _lit(rng.choice(("male", "female")))),
            (u, a, f"<{SIOC}user>"),
            (u, a, f"<{SIB}User>"),
            (u, p_["account_of"], person),
        ]
        for forum in (_iri(SIBFO, f"fo{2 * i}"), _iri(SIBFO, f"fo{2 * i + 1}")):
            static += [(u, p_["moderator_of"], forum), (u, p_["subscriber_of"], forum)]
        for artist in dict.fromkeys(rng.choices(_ARTISTS, artist_weights, k=rng.randint(1, 6))):  # (drawn order)
            static.append((u, p_["interest"], _lit(artist)))
    # Friendships: ~9.6 per user, endpoints drawn by activity, stored both ways as foaf:knows.
    friends: list[set[int]] = [set() for _ in range(users)]
    target = int(9.6 * users)
    made = 0
    while made < target:
        x, y = rng.choices(everyone, cum_weights=act_cum, k=2)
        if x == y or y in friends[x]:
            continue
        friends[x].add(y)
        friends[y].add(x)
        fr = _iri(SIBFR, f"fr{made}")
        static += [
            (user[x], p_["knows"], user[y]),
            (user[y], p_["knows"], user[x]),
            (fr, p_["memb"], user[x]),
            (fr, p_["memb"], user[y]),
            (fr, p_["initiator"], user[x]),
            (fr, p_["requested"], _typed("2010-02-23T05:20:12Z", "dateTime")),
            (fr, p_["approved"], _typed("2010-02-24T05:20:12Z", "dateTime")),
        ]
        made += 1
    for gnum in range(max(1, users // 25)):
        group = _iri(SIBG, f"g{gnum}")
        static.append((group, a, f"<{SIB}Group>"))
        for m in rng.sample(range(users), min(users, 50)):
            membership = _iri(SIBGM, f"gm{gnum}_{m}")
            static += [
                (group, p_["has_member"], user[m]),
                (membership, p_["member_of_membership"], user[m]),
                (membership, p_["group_of_membership"], group),
            ]

    def stamp(k: int) -> str:
        return _typed(f"2010-02-{1 + k // 86400 % 28:02d}T{k // 3600 % 24:02d}:{k // 60 % 60:02d}:{k % 60:02d}Z",
                      "dateTime")

    def pick_related(creator: int) -> int:
        # Half of the tags / likes go to the creator's friends (social locality), half anywhere.
        if friends[creator] and rng.random() < 0.5:
            return rng.choice(tuple(friends[creator]))
        return rng.choices(everyone, cum_weights=act_cum)[0]

    post_stream: list[Triple] = []
    posts: list[tuple[str, int]] = []
    for k in range(int(5.35 * users)):
        creator = rng.choices(everyone, cum_weights=act_cum)[0]
        if posts and rng.random() < 0.1:  # a comment replying to an earlier post
            item = _iri(SIBC, f"c{k}")
            post_stream += [(item, a, f"<{SIB}Comment>"), (item, a, f"<{SIOC}Item>"),
                            (item, p_["reply_of"], rng.choice(posts)[0])]
        else:
            item = _iri(SIBPO, f"po{k}")
            post_stream += [(item, a, f"<{SIB}Post>"), (item, a, f"<{SIOC}Post>"),
                            (item, title, _lit("null"))]
            for word in dict.fromkeys(rng.choices(_WORDS, word_weights, k=rng.randint(1, 5))):
                post_stream.append((item, p_["hashtag"], _lit(word)))
            posts.append((item, creator))
        post_stream += [
            (item, created, stamp(k * 60)),
            (item, p_["browser"], _lit(rng.choices(browser_names, cum_weights=browser_cum)[0])),
            (item, p_["ip_address"], _lit(f"10.{creator % 256}.{k % 256}.1")),
            (item, p_["content"], _lit(" ".join(rng.choices(_WORDS, k=8)))),
            (_iri(SIBFO, f"fo{2 * creator}"), p_["container_of"], item),
            (user[creator], p_["creator_of"], item),
        ]
        if rng.random() < 0.4:
            post_stream.append((item, p_["agent"], _lit(rng.choice(_AGENTS))))

    photo_stream: list[Triple] = []
    photos: list[tuple[str, int]] = []
    n_photo = 0
    for album_no in range(int(0.97 * users)):
        owner = rng.randrange(users)
        album = _iri(SIBPHA, f"pa{album_no}")
        photo_stream += [(album, a, f"<{SIOCT}ImageGallery>"), (album, title, _lit(f"Album {album_no}")),
                         (album, created, stamp(album_no * 3600)), (user[owner], p_["creator_of"], album)]
        for _ in range(max(1, int(rng.gauss(19, 6)))):
            photo = _iri(SIBPHO, f"pho{n_photo}")
            n_photo += 1
            place = rng.choices(places, cum_weights=place_cum)[0]
            photo_stream += [
                (photo, a, f"<{SIB}Photo>"), (photo, a, f"<{SIOC}Item>"),
                (photo, location, _lit(place)),
                (photo, latd, _typed(f"{rng.uniform(-60, 70):.6f}", "double")),
                (photo, longd, _typed(f"{rng.uniform(-180, 180):.6f}", "double")),
                (photo, p_["browser"], _lit(rng.choices(browser_names, cum_weights=browser_cum)[0])),
                (photo, p_["ip_address"], _lit(f"1.{owner % 256}.0.5")),
                (photo, created, stamp(n_photo * 30)),
                (album, p_["container_of"], photo),
            ]
            for tagged in {pick_related(owner) for _ in range(rng.choice((2, 3, 4, 5, 6, 7)))}:
                photo_stream.append((photo, p_["usertag"], user[tagged]))
            if rng.random() < 0.4:
                photo_stream.append((photo, p_["agent"], _lit(rng.choice(_AGENTS))))
            photos.append((photo, owner))

    def likes(items: list[tuple[str, int]], per_item: float) -> list[Triple]:
        out: list[Triple] = []
        for item, creator in items:
            for liker in {pick_related(creator) for _ in range(int(rng.expovariate(1 / per_item)) + 1)}:
                out.append((user[liker], p_["like"], item))
        return out

    streams = {
        "post": post_stream,
        "photo": photo_stream,
        "postlike": likes(posts, 3.6),
        "photolike": likes(photos, 4.0),
    }
    return Dataset(static, streams, f"generated(users={users}, seed={seed})")


# --- stream building ------------------------------------------------------------------------------


def merge_streams(streams: dict[str, list[Triple]]) -> list[Triple]:
    """Interleave the streams in proportion: each is in time order, none carries usable timestamps."""
    keyed: list[tuple[float, int, int]] = []
    for number, name in enumerate(STREAMS):
        items = streams.get(name, [])
        n = len(items)
        keyed += [(k / n, number, k) for k in range(n)]
    keyed.sort()
    return [streams[STREAMS[number]][k] for _, number, k in keyed]


def build_updates(dataset: Dataset, delete_fraction: float = 0.2, window_fraction: float = 0.2,
                  seed: int = 7) -> UpdateStream:
    """Static inserts, then the merged streams with `delete_fraction` of all triples deleted later.

    A deleted triple's delete lands uniformly within `window_fraction` of the stream after its
    insert (static triples: after the static phase), like a sliding window's expiry.
    """
    rng = random.Random(seed)
    seen: set[Triple] = set()
    inserts: list[Triple] = []
    duplicates = 0
    for triple in (*dataset.static, *merge_streams(dataset.streams)):
        if triple in seen:
            duplicates += 1
            continue
        seen.add(triple)
        inserts.append(triple)
    n_static = len(set(dataset.static))
    n = len(inserts)
    updates, deleted = with_deletes(inserts, n_static, delete_fraction, window_fraction, rng)
    stats = {
        "static_triples": n_static,
        "stream_triples": n - n_static,
        "duplicates_dropped": duplicates,
        "inserts": n,
        "deletes": deleted,
        "updates": len(updates),
    }
    return UpdateStream(updates, n_static, dataset.source, stats)


def with_deletes(inserts: list[Triple], n_static: int, delete_fraction: float, window_fraction: float,
                 rng: random.Random) -> tuple[list[UpdateRow], int]:
    """``inserts`` (distinct triples) as updates, ``delete_fraction`` of them deleted uniformly within
    ``window_fraction`` of the stream after their insert (the first ``n_static``: after all of them); the
    number deleted."""
    n = len(inserts)
    window = max(2.0, window_fraction * n)
    keyed: list[tuple[float, int, int]] = [(float(i), 0, i) for i in range(n)]  # (time, kind, index)
    deleted = 0
    for i in range(n):
        if rng.random() >= delete_fraction:
            continue
        start = max(i, n_static) + 0.5
        end = min(float(n), start + window)
        keyed.append((rng.uniform(start, end), 1, i))
        deleted += 1
    keyed.sort()
    updates: list[UpdateRow] = []
    for _, kind, i in keyed:
        s, p, o = inserts[i]
        updates.append((-1 if kind else 1, s, p, o))
    return updates, deleted


def load_or_generate(data_dir: Path | None, users: int = 1000, seed: int = 1) -> Dataset:
    """The LSBench files when `data_dir` holds them, else the generator (same shape; said on stderr, since a bench
    run from elsewhere, a worktree, would otherwise compare two different streams without knowing)."""
    if data_dir is not None and find_files(data_dir) is not None:
        return load_dir(data_dir)
    if data_dir is not None:
        print(f"no LSBench files in {data_dir}: using the generator's stream (users={users}, seed={seed}); "
              "pass --data DIR to read the files", file=sys.stderr, flush=True)
    return generate(users, seed)
