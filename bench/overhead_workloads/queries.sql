-- sqlite3 workload: inserts, an index, joins and aggregates, in memory.
--
-- Run as `sqlite3 :memory: < queries.sql`.  The rows come from a recursive
-- CTE with integer hashing (never random(): the output is checked against
-- a native run), so every run does the same work.  About half a second
-- natively: B-tree inserts and searches, the VDBE bytecode interpreter's
-- dispatch loop, sorting and hashing in the aggregates.
PRAGMA journal_mode = OFF;
PRAGMA synchronous = OFF;

CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, region INTEGER);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER, day INTEGER, amount INTEGER);
CREATE TABLE item (order_id INTEGER, product INTEGER, qty INTEGER);

WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
INSERT INTO customer
SELECT i, 'c' || ((i * 2654435761) % 100003), (i * 7919) % 13 FROM n;

WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 120000)
INSERT INTO orders
SELECT i, 1 + (i * 2654435761) % 20000, (i * 40503) % 365, (i * 69069) % 10007 FROM n;

WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000)
INSERT INTO item
SELECT 1 + (i * 97) % 120000, ((i * 2654435761) / 4096) % 500, 1 + i % 7 FROM n;

CREATE INDEX orders_customer ON orders (customer);
CREATE INDEX item_order ON item (order_id);

-- Revenue per region: a three-way join through both indexes.
SELECT c.region, count(*), sum(o.amount * i.qty)
FROM customer c JOIN orders o ON o.customer = c.id JOIN item i ON i.order_id = o.id
GROUP BY c.region ORDER BY c.region;

-- The ten best customers, and products ordered on many distinct days.
SELECT c.name, sum(o.amount) AS total
FROM customer c JOIN orders o ON o.customer = c.id
GROUP BY c.id ORDER BY total DESC, c.id LIMIT 10;

SELECT product, count(DISTINCT o.day) AS days, sum(qty)
FROM item i JOIN orders o ON o.id = i.order_id
GROUP BY product HAVING days > 305 ORDER BY days DESC, product LIMIT 10;

-- Updates through the index, then a correlated subquery.
UPDATE orders SET amount = amount + 1 WHERE customer % 17 = 0;
SELECT count(*), sum(amount) FROM orders o
WHERE amount > (SELECT avg(amount) FROM orders WHERE customer = o.customer);
