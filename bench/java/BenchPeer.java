// The Java client's side of every snapfence-bench workload, with the command line and RESULT line of
// bench/src/workload.rs (read there what each workload does). Compiled by the runner against the broker's
// own kafka-clients jar:
//   javac -cp "<kafka libs>/*" -d DIR BenchPeer.java && java -cp "<kafka libs>/*:DIR" BenchPeer WORKLOAD ARGS...
// Producer settings match snapfence's defaults: acks=all, idempotent, linger.ms 5 (0 for plain-seq, as the
// runner asks), batch.size 256 KiB. The group commit is what snapfence's does when N writes arrive at once:
// consecutive transactions of up to CAP writes, each also committing the input offset as the group member.
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.*;

public class BenchPeer {
    public static void main(String[] a) throws Exception {
        switch (a[0]) {
            case "plain-seq", "plain-burst" -> plain(a[1], a[2], Integer.parseInt(a[3]), Integer.parseInt(a[4]),
                Integer.parseInt(a[5]), a[0].equals("plain-burst"), a.length > 6 ? Integer.parseInt(a[6]) : 1);
            case "txn-seq" -> txn(a, Integer.parseInt(a[8]), Integer.parseInt(a[9]), 1);
            case "txn-burst" -> txn(a, Integer.parseInt(a[8]), Integer.parseInt(a[9]), Integer.parseInt(a[10]));
            case "recover" -> {
                for (int i = 1; i < Integer.parseInt(a[3]); i++) recover(a[1], a[2]);
                long t = System.nanoTime();
                Map<ByteBuffer, ByteBuffer> state = recover(a[1], a[2]);
                result(t, state.size(), bytes(state), null);
            }
            case "takeover" -> {
                long t = System.nanoTime();
                Properties p = producerProps(a[1], 5);
                p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, a[3] + "-0");
                try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
                    producer.initTransactions();
                    double acquire = (System.nanoTime() - t) / 1e6;
                    Map<ByteBuffer, ByteBuffer> state = recover(a[1], a[2]);
                    result(t, state.size(), bytes(state), String.format(" acquire_ms=%.3f", acquire));
                }
            }
            default -> throw new IllegalArgumentException("unknown workload " + a[0]);
        }
    }

    static byte[] key(int i) {
        return String.format("key-%06d", i).getBytes(StandardCharsets.UTF_8);
    }

    static byte[] value(int size, int i) {
        byte[] v = new byte[size];
        Arrays.fill(v, (byte) ('a' + i % 26));
        return v;
    }

    static Properties producerProps(String bootstrap, int lingerMs) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, String.valueOf(lingerMs));
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, String.valueOf(256 * 1024));
        return p;
    }

    // PARTITIONS (plain-burst's optional last argument): record i goes to partition i % PARTITIONS.
    static void plain(String bootstrap, String topic, int n, int size, int lingerMs, boolean burst, int partitions) throws Exception {
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps(bootstrap, lingerMs))) {
            producer.send(new ProducerRecord<>(topic, 0, key(n), value(size, n))).get();
            long t = System.nanoTime();
            if (burst) {
                List<Future<RecordMetadata>> pending = new ArrayList<>(n);
                for (int i = 0; i < n; i++) pending.add(producer.send(new ProducerRecord<>(topic, i % partitions, key(i), value(size, i))));
                for (Future<RecordMetadata> f : pending) f.get();
            } else {
                for (int i = 0; i < n; i++) producer.send(new ProducerRecord<>(topic, 0, key(i), value(size, i))).get();
            }
            result(t, n, 0, null);
        }
    }

    // a: txn-* BOOTSTRAP TOPIC TXN_ID INPUT GROUP GENERATION MEMBER N SIZE [CAP]
    static void txn(String[] a, int n, int size, int cap) throws Exception {
        String topic = a[2];
        Properties p = producerProps(a[1], 5);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, a[3]);
        TopicPartition input = new TopicPartition(a[4], 0);
        ConsumerGroupMetadata group = new ConsumerGroupMetadata(a[5], Integer.parseInt(a[6]), a[7], Optional.empty());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            // Warm-up: coordinators found, connections open, before the clock starts.
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, 0, key(n), value(size, n)));
            producer.sendOffsetsToTransaction(Map.of(input, new OffsetAndMetadata(0)), group);
            producer.commitTransaction();
            long t = System.nanoTime();
            int txns = 0;
            for (int first = 0; first < n; first += cap) {
                int last = Math.min(n, first + cap);
                producer.beginTransaction();
                List<Future<RecordMetadata>> pending = new ArrayList<>(last - first);
                for (int i = first; i < last; i++) pending.add(producer.send(new ProducerRecord<>(topic, 0, key(i), value(size, i))));
                producer.sendOffsetsToTransaction(Map.of(input, new OffsetAndMetadata(last)), group);
                producer.commitTransaction();
                for (Future<RecordMetadata> f : pending) f.get();
                txns++;
            }
            result(t, n, 0, " txns=" + txns);
        }
    }

    // Earliest to the high watermark (captured first by a read_uncommitted consumer) at read_committed.
    static Map<ByteBuffer, ByteBuffer> recover(String bootstrap, String topic) {
        TopicPartition tp = new TopicPartition(topic, 0);
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_uncommitted");
        long target;
        try (KafkaConsumer<byte[], byte[]> probe = new KafkaConsumer<>(p)) {
            target = probe.endOffsets(List.of(tp)).get(tp);
        }
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        Map<ByteBuffer, ByteBuffer> state = new HashMap<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            while (consumer.position(tp) < target) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    if (r.key() == null) continue;
                    if (r.value() == null) state.remove(ByteBuffer.wrap(r.key()));
                    else state.put(ByteBuffer.wrap(r.key()), ByteBuffer.wrap(r.value()));
                }
            }
        }
        return state;
    }

    static long bytes(Map<ByteBuffer, ByteBuffer> state) {
        long b = 0;
        for (Map.Entry<ByteBuffer, ByteBuffer> e : state.entrySet()) b += e.getKey().remaining() + e.getValue().remaining();
        return b;
    }

    static void result(long startNanos, long records, long bytes, String extra) throws Exception {
        double ms = (System.nanoTime() - startNanos) / 1e6;
        long rss = -1;
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith("VmHWM:")) rss = Long.parseLong(line.replaceAll("[^0-9]", ""));
        }
        StringBuilder s = new StringBuilder(String.format("RESULT ms=%.3f records=%d", ms, records));
        if (bytes > 0) s.append(" bytes=").append(bytes);
        if (rss >= 0) s.append(" rss_kib=").append(rss);
        if (extra != null) s.append(extra);
        System.out.println(s);
        System.out.flush();
    }
}
