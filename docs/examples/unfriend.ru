# Bob no longer knows Carol: the answers through that edge are retracted.
PREFIX foaf: <http://xmlns.com/foaf/0.1/>
PREFIX ex: <http://example.org/people/>
DELETE DATA { ex:bob foaf:knows ex:carol }
