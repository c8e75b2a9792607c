"""The geometry of positions: Hellinger distances, classical MDS, stress, diagnostics, SMACOF, encodings (numpy or cupy via backend)."""
