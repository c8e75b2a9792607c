"""What the architecture alone does to positions: causal-residual influence, adjacency, a random causal transformer."""
