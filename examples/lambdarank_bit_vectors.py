"""Task-specific bit vectors learned by ranking (the WWW paper on learning bit vectors with
RankNet / LambdaRank for fast nearest-neighbour classification).

``RankHashing`` trains a sigmoid layer whose rounded outputs are the bits, ranking each
query's documents by a relaxed Hamming score (LambdaRank objective). Classification uses a
*relative* threshold: the query's 3 nearest non-empty Hamming distance bins vote
(``Searcher.neighbors(n_bins=3)``). Compared with LSH at the same code length by k-NN
classification error on held-out digits. Runs in well under 30 s.
"""

import numpy as np

from hashlearn import RandomHyperplaneLSH, RankHashing, Searcher, load_digits


def bin_vote_error(searcher, X_q, y_q, y_db):
    lims, _, ids = searcher.neighbors(X_q, n_bins=3)
    predicted = np.array(
        [
            np.bincount(y_db[ids[lims[i] : lims[i + 1]]], minlength=10).argmax()
            for i in range(len(X_q))
        ]
    )
    return float(np.mean(predicted != y_q))


def main():
    X, y = load_digits()
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    q, db = perm[:300], perm[300:]
    for name, hasher in [
        ("LSH", RandomHyperplaneLSH(16, random_state=0)),
        ("LambdaRank codes", RankHashing(16, n_epochs=5, random_state=0)),
    ]:
        s = Searcher(hasher).fit(X[db], y[db]).add(X[db])
        error = bin_vote_error(s, X[q], y[q], y[db])
        print(f"{name:>16}: k-NN error (3 nearest Hamming bins vote, 16 bits) {error:.3f}")


if __name__ == "__main__":
    main()
