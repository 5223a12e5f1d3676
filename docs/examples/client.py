"""Follow a continuous query from Python: register it, change the graph, read its current answers as a DataFrame and
its deltas as they come.  Run it next to `make run` (it finds the gateway and its token in .run/cbgp.env):

    .venv/bin/python docs/examples/client.py
"""

from __future__ import annotations

from pathlib import Path

from services.client.gateway import GatewayClient

HERE = Path(__file__).parent
FOAF = "http://xmlns.com/foaf/0.1/"
EX = "http://example.org/people/"

client = GatewayClient()
client.register("fof-example", (HERE / "friends-of-friends.rq").read_text())

# Alice knows Bob, who knows Carol and Dave: Alice's friends of friends are Carol and Dave.
client.update(f"""PREFIX foaf: <{FOAF}> PREFIX ex: <{EX}>
INSERT DATA {{ ex:alice foaf:name "Alice" ; foaf:knows ex:bob . ex:bob foaf:name "Bob" ;
               foaf:knows ex:carol , ex:dave . ex:carol foaf:name "Carol" . ex:dave foaf:name "Dave" }}""")
deltas = client.deltas("fof-example")
for delta in deltas:  # each answer as it appears: +1 and its row of pyoxigraph terms
    print("+" if delta.diff > 0 else "-", delta.row["person"].value, "->", delta.row["fof"].value)
    if delta.n == 2:
        break

# Bob forgets Dave: that answer disappears (a -1 delta), and the current answers say so.
client.update(f"PREFIX foaf: <{FOAF}> PREFIX ex: <{EX}> DELETE DATA {{ ex:bob foaf:knows ex:dave }}")
for delta in client.deltas("fof-example", start=3):
    print("+" if delta.diff > 0 else "-", delta.row["person"].value, "->", delta.row["fof"].value)
    break
print(client.current_frame("fof-example").to_string(index=False))
client.unregister("fof-example")
